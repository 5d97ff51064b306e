package imageclient

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate"
)

// answer is one scripted server response; drop closes the connection
// after reading the request instead of answering (a lost response).
type answer struct {
	drop   bool
	status int
	header map[string]string
	body   string
}

// fakeServer answers requests from a script and records what it saw.
type fakeServer struct {
	mu     sync.Mutex
	script []answer
	keys   []string // Idempotency-Key of every request
	paths  []string
	*httptest.Server
}

func newFakeServer(t *testing.T, script ...answer) *fakeServer {
	t.Helper()
	f := &fakeServer{script: script}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		f.mu.Lock()
		f.keys = append(f.keys, r.Header.Get("Idempotency-Key"))
		f.paths = append(f.paths, r.Method+" "+r.URL.Path)
		if len(f.script) == 0 {
			f.mu.Unlock()
			t.Errorf("unexpected request %s %s", r.Method, r.URL.Path)
			w.WriteHeader(http.StatusTeapot)
			return
		}
		a := f.script[0]
		f.script = f.script[1:]
		f.mu.Unlock()
		if a.drop {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		for k, v := range a.header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(a.status)
		io.WriteString(w, a.body)
	}))
	t.Cleanup(f.Close)
	return f
}

// seen returns the Idempotency-Key and "METHOD path" of every request so far.
func (f *fakeServer) seen() (keys, paths []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.keys...), append([]string(nil), f.paths...)
}

// recordSleeps returns a Sleep that records waits instead of waiting.
func recordSleeps(waits *[]time.Duration) func(context.Context, time.Duration) error {
	var mu sync.Mutex
	return func(ctx context.Context, d time.Duration) error {
		mu.Lock()
		*waits = append(*waits, d)
		mu.Unlock()
		return ctx.Err()
	}
}

const accepted = `{"task_id":"t1","status":"pending","poll_after_ms":700}`

func problem(status int, code idemgate.Code) answer {
	b, _ := json.Marshal(map[string]any{"type": "about:blank", "title": http.StatusText(status), "status": status, "code": code})
	return answer{status: status, header: map[string]string{"Content-Type": "application/problem+json"}, body: string(b)}
}

func TestSubmitImages(t *testing.T) {
	t.Parallel()
	ok := answer{status: 202, header: map[string]string{"Location": "/v1/tasks/t1", "Retry-After": "1"}, body: accepted}
	replayed := ok
	replayed.header = map[string]string{"Location": "/v1/tasks/t1", "Idempotent-Replayed": "true"}
	busy := problem(409, idemgate.CodeRequestInProgress)
	busy.header["Retry-After"] = "2"
	tests := []struct {
		name         string
		given        []answer
		wantErr      error // nil: success
		wantAttempts int
		wantWaits    []time.Duration
		wantReplayed bool
	}{
		{name: "first try", given: []answer{ok}, wantAttempts: 1},
		{name: "lost response is retried with the same id and replays", given: []answer{{drop: true}, replayed},
			wantAttempts: 2, wantWaits: []time.Duration{100 * time.Millisecond}, wantReplayed: true},
		{name: "key_reused is never retried", given: []answer{problem(409, idemgate.CodeKeyReused)},
			wantErr: ErrKeyReused, wantAttempts: 1},
		{name: "in progress waits Retry-After then retries", given: []answer{busy, replayed},
			wantAttempts: 2, wantWaits: []time.Duration{2 * time.Second}, wantReplayed: true},
		{name: "5xx backs off exponentially", given: []answer{problem(503, idemgate.CodeStoreUnavailable), problem(502, ""), ok},
			wantAttempts: 3, wantWaits: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}},
		{name: "400 is final", given: []answer{problem(400, idemgate.CodeBodyInvalid)}, wantErr: &Problem{}, wantAttempts: 1},
		{name: "gives up after MaxAttempts", given: []answer{{drop: true}, {drop: true}, {drop: true}},
			wantErr: errAny, wantAttempts: 3, wantWaits: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, tt.given...)
			var waits []time.Duration
			c := New(Config{BaseURL: srv.URL, Token: "tok", MaxAttempts: 3, Sleep: recordSleeps(&waits)})
			req := ImageRequest{Prompt: "a red fox", AspectRatio: "1:1", N: 1}
			id := RequestID("poster:launch", req)

			sub, err := c.SubmitImages(context.Background(), id, req)

			switch {
			case tt.wantErr == nil && err != nil:
				t.Fatalf("SubmitImages: %v", err)
			case tt.wantErr == errAny && err == nil, tt.wantErr != nil && tt.wantErr != errAny && err == nil:
				t.Fatalf("SubmitImages succeeded, want an error")
			case tt.wantErr == ErrKeyReused && !errors.Is(err, ErrKeyReused):
				t.Fatalf("err = %v, want ErrKeyReused", err)
			}
			if p, ok := tt.wantErr.(*Problem); ok && p != nil {
				var got *Problem
				if !errors.As(err, &got) {
					t.Fatalf("err = %T %v, want *Problem", err, err)
				}
			}
			keys, _ := srv.seen()
			if len(keys) != tt.wantAttempts {
				t.Fatalf("server saw %d requests, want %d", len(keys), tt.wantAttempts)
			}
			for i, k := range keys {
				if k != id {
					t.Errorf("attempt %d sent Idempotency-Key %q, want %q", i+1, k, id)
				}
			}
			if !jittered(waits, tt.wantWaits) {
				t.Errorf("waits = %v, want %v", waits, tt.wantWaits)
			}
			if err == nil {
				if sub.TaskID != "t1" || sub.Location != "/v1/tasks/t1" || sub.Replayed != tt.wantReplayed {
					t.Errorf("submission = %+v", sub)
				}
				if sub.PollAfter < 700*time.Millisecond {
					t.Errorf("PollAfter = %v, want ≥ poll_after_ms 700ms", sub.PollAfter)
				}
			}
		})
	}
}

var errAny = errors.New("any error")

// jittered reports whether each wait in got is the one in want as the
// client package jitters it: a backoff b drawn from [b/2, b], a Retry-After
// h from [h, 1.25h].
func jittered(got, want []time.Duration) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] < want[i]/2 || got[i] > want[i]+want[i]/4 {
			return false
		}
	}
	return true
}

func task(status string, pollMS int, extra string) answer {
	body := `{"task_id":"t1","status":"` + status + `"`
	if pollMS > 0 {
		body += `,"poll_after_ms":` + strconv.Itoa(pollMS)
	}
	return answer{status: 200, body: body + extra + "}"}
}

func TestWait(t *testing.T) {
	t.Parallel()
	png := `"data:image/png;base64,iVBORw0KGgo="`
	tests := []struct {
		name      string
		given     []answer
		wantErr   error
		wantWaits []time.Duration
		wantPNGs  int
	}{
		{name: "polls the same task until it succeeds, honouring poll_after_ms",
			given:     []answer{task("pending", 1500, ""), task("running", 50, ""), task("succeeded", 0, `,"images":[`+png+`]`)},
			wantWaits: []time.Duration{700 * time.Millisecond, 1500 * time.Millisecond, 200 * time.Millisecond}, wantPNGs: 1},
		{name: "a transport error while polling is retried",
			given:     []answer{{drop: true}, task("succeeded", 0, `,"images":[`+png+`,`+png+`]`)},
			wantWaits: []time.Duration{700 * time.Millisecond, 100 * time.Millisecond}, wantPNGs: 2},
		{name: "failed is terminal",
			given:     []answer{task("uncertain", 1000, ""), task("failed", 0, `,"error":"upstream refused"`)},
			wantErr:   ErrTaskFailed,
			wantWaits: []time.Duration{700 * time.Millisecond, 1000 * time.Millisecond}},
		{name: "another user's task is a 404 problem",
			given: []answer{problem(404, "not_found")}, wantErr: &Problem{}, wantWaits: []time.Duration{700 * time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, tt.given...)
			var waits []time.Duration
			c := New(Config{BaseURL: srv.URL, Token: "tok", Sleep: recordSleeps(&waits)})

			got, err := c.Wait(context.Background(), "t1", 700*time.Millisecond)

			if tt.wantErr == nil && err != nil {
				t.Fatalf("Wait: %v", err)
			}
			if tt.wantErr == ErrTaskFailed && (!errors.Is(err, ErrTaskFailed) || got.Error != "upstream refused") {
				t.Fatalf("Wait = %+v, %v; want the failed task and ErrTaskFailed", got, err)
			}
			if _, ok := tt.wantErr.(*Problem); ok {
				var p *Problem
				if !errors.As(err, &p) || p.Status != 404 {
					t.Fatalf("err = %v, want a 404 *Problem", err)
				}
			}
			_, paths := srv.seen()
			for i, p := range paths {
				if p != "GET /v1/tasks/t1" {
					t.Errorf("request %d = %s, want GET /v1/tasks/t1", i, p)
				}
			}
			if !jittered(waits, tt.wantWaits) {
				t.Errorf("waits = %v, want %v", waits, tt.wantWaits)
			}
			if tt.wantPNGs > 0 {
				pngs, err := got.PNGs()
				if err != nil || len(pngs) != tt.wantPNGs || string(pngs[0][1:4]) != "PNG" {
					t.Errorf("PNGs() = %d images, %v; want %d PNGs", len(pngs), err, tt.wantPNGs)
				}
			}
		})
	}
}

func TestRequestID(t *testing.T) {
	t.Parallel()
	base := ImageRequest{Prompt: "a red fox", AspectRatio: "16:9", N: 1}
	tests := []struct {
		name     string
		given    ImageRequest
		wantSame bool
	}{
		{name: "same parameters, same id", given: base, wantSame: true},
		{name: "client note does not count", given: ImageRequest{Prompt: "a red fox", AspectRatio: "16:9", N: 1, ClientNote: "retry"}, wantSame: true},
		{name: "reworded prompt", given: ImageRequest{Prompt: "a red fox ", AspectRatio: "16:9", N: 1}},
		{name: "other aspect ratio", given: ImageRequest{Prompt: "a red fox", AspectRatio: "9:16", N: 1}},
		{name: "more images", given: ImageRequest{Prompt: "a red fox", AspectRatio: "16:9", N: 2}},
		{name: "reference image", given: ImageRequest{Prompt: "a red fox", AspectRatio: "16:9", N: 1, ReferenceImage: "https://example.com/a.png"}},
	}
	want := RequestID("poster:launch", base)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := RequestID("poster:launch", tt.given)
			if (got == want) != tt.wantSame {
				t.Errorf("RequestID = %q, base %q; same = %v, want %v", got, want, got == want, tt.wantSame)
			}
		})
	}
}
