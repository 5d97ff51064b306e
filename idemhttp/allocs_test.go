package idemhttp_test

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/idemhttp"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/middleware"
)

const benchBody = `{"prompt":"a red fox in the snow, watercolor","aspect_ratio":"16:9","n":1,"client_note":"retry 2"}`

var benchResponse = []byte(`{"task_id":"0a1b2c3d4e5f","status":"pending","poll_after_ms":500}`)

type discardWriter struct {
	h    http.Header
	code int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(code int)        { w.code = code }

type reusableBody struct{ strings.Reader }

func (*reusableBody) Close() error { return nil }

// TestAllocsPerRequest holds idemhttp's paths on a real redis-server, on
// a ServeMux route, to the allocations docs/performance.md states, go-redis's
// own included: each at most the echo middleware's (miss 49, replay 15,
// request_in_progress 25, key_reused 18, its TestAllocsPerRequest), and
// exactly the figure the doc gives, so that a path that gains or loses an
// allocation fails until the doc moves. Not under the race detector,
// which allocates on its own.
func TestAllocsPerRequest(t *testing.T) {
	if raceDetector() {
		t.Skip("the race detector allocates")
	}
	want := map[string]float64{"miss": 48, "replay": 15, "request_in_progress": 25, "key_reused": 18}
	echo := map[string]float64{"miss": 49, "replay": 15, "request_in_progress": 25, "key_reused": 18}

	client := redis.NewClient(testenv.Redis(t))
	t.Cleanup(func() { client.Close() })
	var id [6]byte
	_, _ = rand.Read(id[:])
	prefix := hex.EncodeToString(id[:]) + "-"
	mw := idemhttp.New(idemhttp.Config{
		Store: middleware.NewRedisStore(client),
		Scope: func(*http.Request) (string, string, error) { return "acme", "alice", nil },
		Kind:  "image",
	})
	hold, held := make(chan struct{}), make(chan struct{})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/images", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == prefix+"in-progress" {
			close(held)
			<-hold
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(benchResponse)
	})))
	req, _ := http.NewRequest(http.MethodPost, "/v1/images", nil)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k")
	body, w := &reusableBody{}, &discardWriter{h: http.Header{}}
	serve := func(key, b string, status int) {
		body.Reset(b)
		req.Body, req.ContentLength = body, int64(len(b))
		req.Header["Idempotency-Key"][0] = key
		clear(w.h)
		w.code = 0
		mux.ServeHTTP(w, req)
		if w.code != status {
			t.Fatalf("key %s: status %d, want %d", key, w.code, status)
		}
	}
	done := make(chan struct{})
	go func() {
		r, _ := http.NewRequest(http.MethodPost, "/v1/images", strings.NewReader(benchBody))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", prefix+"in-progress")
		mux.ServeHTTP(&discardWriter{h: http.Header{}}, r)
		close(done)
	}()
	<-held
	t.Cleanup(func() { close(hold); <-done })
	serve(prefix+"replay", benchBody, http.StatusCreated)
	serve(prefix+"reused", `{"prompt":"something else"}`, http.StatusCreated)
	serve(prefix+"warm", benchBody, http.StatusCreated)
	misses := make([]string, 1000)
	for i := range misses {
		misses[i] = prefix + "miss-" + strconv.Itoa(i)
	}
	i := 0
	for _, p := range []struct {
		name string
		key  func() string
		want int
	}{
		{"miss", func() string { i++; return misses[i%len(misses)] }, http.StatusCreated},
		{"replay", func() string { return prefix + "replay" }, http.StatusCreated},
		{"request_in_progress", func() string { return prefix + "in-progress" }, http.StatusConflict},
		{"key_reused", func() string { return prefix + "reused" }, http.StatusConflict},
	} {
		got := testing.AllocsPerRun(200, func() { serve(p.key(), benchBody, p.want) })
		if got > echo[p.name] {
			t.Errorf("%s: %.0f allocations per request, more than the echo middleware's %.0f", p.name, got, echo[p.name])
		}
		if got != want[p.name] {
			t.Errorf("%s: %.0f allocations per request, docs/performance.md says %.0f", p.name, got, want[p.name])
		}
	}
}

// raceDetector reports whether the test binary was built with -race.
func raceDetector() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}
