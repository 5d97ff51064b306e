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
	"github.com/idemgate/idemgate/redisstore"
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

// pathCase is one path of a protected request, as middleware's bench
// tests have them.
type pathCase struct {
	name string
	key  func() string
	want int
}

// pathCases serves a ServeMux route protected by idemhttp on a real
// redis-server, with a key for each path ready: serve sends one request
// and checks its status.
func pathCases(tb testing.TB) (serve func(key string, status int), paths []pathCase) {
	tb.Helper()
	client := redis.NewClient(testenv.Redis(tb))
	tb.Cleanup(func() { client.Close() })
	var id [6]byte
	_, _ = rand.Read(id[:])
	prefix := hex.EncodeToString(id[:]) + "-"
	mw := idemhttp.New(idemhttp.Config{
		Store: redisstore.New(client),
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
	send := func(key, b string, status int) {
		body.Reset(b)
		req.Body, req.ContentLength = body, int64(len(b))
		req.Header["Idempotency-Key"][0] = key
		clear(w.h)
		w.code = 0
		mux.ServeHTTP(w, req)
		if w.code != status {
			tb.Fatalf("key %s: status %d, want %d", key, w.code, status)
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
	tb.Cleanup(func() { close(hold); <-done })
	send(prefix+"replay", benchBody, http.StatusCreated)
	send(prefix+"reused", `{"prompt":"something else"}`, http.StatusCreated)
	send(prefix+"warm", benchBody, http.StatusCreated)
	// The keys are made here, so that a request allocates only what the
	// middleware and go-redis do.
	misses := make([]string, 1000)
	for i := range misses {
		misses[i] = prefix + "miss-" + strconv.Itoa(i)
	}
	i := 0
	return func(key string, status int) { send(key, benchBody, status) }, []pathCase{
		{"miss", func() string {
			if i++; i < len(misses) {
				return misses[i]
			}
			return prefix + "miss-" + strconv.Itoa(i) // a benchmark's later requests
		}, http.StatusCreated},
		{"replay", func() string { return prefix + "replay" }, http.StatusCreated},
		{"request_in_progress", func() string { return prefix + "in-progress" }, http.StatusConflict},
		{"key_reused", func() string { return prefix + "reused" }, http.StatusConflict},
	}
}

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
	serve, paths := pathCases(t)
	for _, p := range paths {
		got := testing.AllocsPerRun(200, func() { serve(p.key(), p.want) })
		if got > echo[p.name] {
			t.Errorf("%s: %.0f allocations per request, more than the echo middleware's %.0f", p.name, got, echo[p.name])
		}
		if got != want[p.name] {
			t.Errorf("%s: %.0f allocations per request, docs/performance.md says %.0f", p.name, got, want[p.name])
		}
	}
}

// BenchmarkPaths times each path in this process (the middleware and
// go-redis; the redis-server's time is the round trip's), to set beside
// middleware's BenchmarkMiss and BenchmarkReplay:
// go test -run '^$' -bench Paths -benchtime 2000x ./idemhttp/
func BenchmarkPaths(b *testing.B) {
	serve, paths := pathCases(b)
	for _, p := range paths {
		b.Run(p.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				serve(p.key(), p.want)
			}
		})
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
