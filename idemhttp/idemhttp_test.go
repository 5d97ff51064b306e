package idemhttp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/idemhttp"
	"github.com/idemgate/idemgate/redisstore"
)

// newStore returns a Redis store on a miniredis of the test's own.
func newStore(t *testing.T) idemgate.Store {
	t.Helper()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return redisstore.New(rdb)
}

type ctxKey string

// scopeFromHeader stands in for an auth middleware's identity.
func scopeFromHeader(r *http.Request) (string, string, error) {
	tenant, user, ok := strings.Cut(r.Header.Get("X-Caller"), "/")
	if !ok {
		return "", "", errors.New("no caller")
	}
	return tenant, user, nil
}

// orders is a ServeMux with one protected route; runs counts the
// handler's runs.
func orders(t *testing.T, cfg idemhttp.Config, runs *atomic.Int64) *http.ServeMux {
	t.Helper()
	if cfg.Store == nil {
		cfg.Store = newStore(t)
	}
	if cfg.Scope == nil {
		cfg.Scope = scopeFromHeader
	}
	mw := idemhttp.New(cfg)
	mux := http.NewServeMux()
	mux.Handle("POST /v1/orders/{id}/refund", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/v1/refunds/"+r.PathValue("id"))
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"order":"`+r.PathValue("id")+`","run":`+string(rune('0'+n))+`,"body":`+string(body)+`}`)
	})))
	return mux
}

func send(t *testing.T, h http.Handler, method, target, key, body string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("X-Caller", "acme/alice")
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestServeMuxRetries: on a ServeMux route, a retry with the same key and
// parameters replays the first answer byte for byte and the handler runs
// once; another path value, another query or another body under the same
// key is key_reused; no key passes through.
func TestServeMuxRetries(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		target   string
		body     string
		key      string
		wantCode int
		wantRuns int64
		wantBody string
	}{
		{name: "same request replays", target: "/v1/orders/7/refund", body: `{"a":1}`, key: "k1", wantCode: 201, wantRuns: 1},
		{name: "other path value is reused", target: "/v1/orders/8/refund", body: `{"a":1}`, key: "k1", wantCode: 409, wantRuns: 1,
			wantBody: `"code":"key_reused"`},
		{name: "other query is reused", target: "/v1/orders/7/refund?dry_run=true", body: `{"a":1}`, key: "k1", wantCode: 409, wantRuns: 1,
			wantBody: `"code":"key_reused"`},
		{name: "other body is reused", target: "/v1/orders/7/refund", body: `{"a":2}`, key: "k1", wantCode: 409, wantRuns: 1,
			wantBody: `"code":"key_reused"`},
		{name: "no key runs unprotected", target: "/v1/orders/7/refund", body: `{"a":1}`, wantCode: 201, wantRuns: 2},
	}
	var runs atomic.Int64
	h := orders(t, idemhttp.Config{}, &runs)
	first := send(t, h, http.MethodPost, "/v1/orders/7/refund", "k1", `{"a":1}`)
	if first.Code != http.StatusCreated || runs.Load() != 1 {
		t.Fatalf("first request: %d after %d runs, want 201 after 1", first.Code, runs.Load())
	}
	for _, tt := range tests { // in order: each depends on the runs before
		t.Run(tt.name, func(t *testing.T) {
			got := send(t, h, http.MethodPost, tt.target, tt.key, tt.body)
			if got.Code != tt.wantCode || runs.Load() != tt.wantRuns {
				t.Fatalf("%d after %d runs, want %d after %d: %s", got.Code, runs.Load(), tt.wantCode, tt.wantRuns, got.Body)
			}
			if tt.wantBody != "" && !strings.Contains(got.Body.String(), tt.wantBody) {
				t.Errorf("body %s, want it to contain %s", got.Body, tt.wantBody)
			}
			if tt.name == "same request replays" {
				if got.Body.String() != first.Body.String() || got.Header().Get("Location") != "/v1/refunds/7" ||
					got.Header().Get("Content-Type") != "application/json" || got.Header().Get("Idempotent-Replayed") != "true" {
					t.Errorf("replay %d %v %q; first %d %v %q", got.Code, got.Header(), got.Body, first.Code, first.Header(), first.Body)
				}
			}
		})
	}
}

// TestWrappingTheWholeMux: before the mux routes, r.Pattern is empty; the
// mux's pattern names the route and the path stands for its values: a
// retry replays, the same key on another path is key_reused, and a
// request the mux answers 404 or 405 passes through untouched, even with
// a body over MaxBodyBytes.
func TestWrappingTheWholeMux(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/orders/{id}/refund", func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, r.PathValue("id"))
	})
	h := idemhttp.New(idemhttp.Config{Store: newStore(t), Scope: scopeFromHeader, MaxBodyBytes: 64})(mux)

	if got := send(t, h, http.MethodPost, "/v1/orders/7/refund", "k", `{}`); got.Code != 201 || got.Body.String() != "7" {
		t.Fatalf("first: %d %q", got.Code, got.Body)
	}
	if got := send(t, h, http.MethodPost, "/v1/orders/7/refund", "k", `{}`); got.Code != 201 || got.Header().Get("Idempotent-Replayed") != "true" || runs.Load() != 1 {
		t.Fatalf("retry: %d replayed %q after %d runs, want a replayed 201 after 1", got.Code, got.Header().Get("Idempotent-Replayed"), runs.Load())
	}
	if got := send(t, h, http.MethodPost, "/v1/orders/8/refund", "k", `{}`); got.Code != http.StatusConflict || runs.Load() != 1 {
		t.Fatalf("same key, other path: %d after %d runs, want 409 after 1", got.Code, runs.Load())
	}
	big := `{"x":"` + strings.Repeat("x", 100) + `"}`
	for _, tt := range []struct {
		method, target string
		want           int
	}{
		{http.MethodPost, "/nowhere", http.StatusNotFound},
		{http.MethodPatch, "/v1/orders/7/refund", http.StatusMethodNotAllowed},
	} {
		for try := range 2 {
			got := send(t, h, tt.method, tt.target, "k-"+tt.target, big)
			if got.Code != tt.want || got.Header().Get("X-Should-Retry") != "" || got.Header().Get("Idempotent-Replayed") != "" {
				t.Fatalf("%s %s, try %d: %d %v, want the mux's own %d", tt.method, tt.target, try, got.Code, got.Header(), tt.want)
			}
		}
	}
}

// TestScopeErrorIsUnauthorized: a request whose identity the Scope cannot
// read is answered 401 and its handler never runs.
func TestScopeErrorIsUnauthorized(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	h := orders(t, idemhttp.Config{}, &runs)
	r := httptest.NewRequest(http.MethodPost, "/v1/orders/1/refund", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "k")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusUnauthorized || runs.Load() != 0 {
		t.Fatalf("%d after %d runs, want 401 after 0", w.Code, runs.Load())
	}
}

// TestErrorHandler: an ErrorHandler renders the problems it writes, with
// x-should-retry already set; one that writes nothing leaves the default
// problem+json.
func TestErrorHandler(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		handler  func(w http.ResponseWriter, r *http.Request, p idemgate.Problem)
		wantType string
		wantBody string
	}{
		{name: "renders", handler: func(w http.ResponseWriter, _ *http.Request, p idemgate.Problem) {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(p.Status)
			io.WriteString(w, "mine: "+string(p.Code))
		}, wantType: "text/plain", wantBody: "mine: key_invalid"},
		{name: "leaves it to the default", handler: func(http.ResponseWriter, *http.Request, idemgate.Problem) {},
			wantType: "application/problem+json", wantBody: `"code":"key_invalid"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var runs atomic.Int64
			h := orders(t, idemhttp.Config{ErrorHandler: tt.handler}, &runs)
			r := httptest.NewRequest(http.MethodPost, "/v1/orders/1/refund", strings.NewReader(`{}`))
			r.Header.Set("X-Caller", "acme/alice")
			r.Header["Idempotency-Key"] = []string{"a", "b"}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusBadRequest || w.Header().Get("Content-Type") != tt.wantType ||
				!strings.Contains(w.Body.String(), tt.wantBody) || w.Header().Get("X-Should-Retry") != "false" {
				t.Fatalf("%d %v %q, want 400 %s with %s and x-should-retry: false", w.Code, w.Header(), w.Body, tt.wantType, tt.wantBody)
			}
		})
	}
}

// TestInFlightAndPanic: a retry while the first request runs is answered
// 409 request_in_progress with Retry-After; a handler that panics releases
// the key, so the next retry runs it again.
func TestInFlightAndPanic(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	mw := idemhttp.New(idemhttp.Config{Store: newStore(t), Scope: scopeFromHeader})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/jobs", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch calls.Add(1) {
		case 1:
			close(entered)
			<-release
			panic("boom")
		default:
			w.WriteHeader(http.StatusAccepted)
		}
	})))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() { recover() }() // the test's stand-in for net/http's own recovery
		send(t, mux, http.MethodPost, "/v1/jobs", "k", `{}`)
	}()
	<-entered
	got := send(t, mux, http.MethodPost, "/v1/jobs", "k", `{}`)
	if got.Code != http.StatusConflict || !strings.Contains(got.Body.String(), "request_in_progress") || got.Header().Get("Retry-After") == "" {
		t.Fatalf("retry in flight: %d %v %q, want 409 request_in_progress with Retry-After", got.Code, got.Header(), got.Body)
	}
	close(release)
	wg.Wait()
	if got := send(t, mux, http.MethodPost, "/v1/jobs", "k", `{}`); got.Code != http.StatusAccepted || calls.Load() != 2 {
		t.Fatalf("retry after the panic: %d after %d calls, want 202 after 2", got.Code, calls.Load())
	}
}

// TestHandlerReadsItsRequest: the handler finds its key and fingerprint
// with idemgate.RequestFromContext, and the body it reads is the one sent;
// a skipped request carries none.
func TestHandlerReadsItsRequest(t *testing.T) {
	t.Parallel()
	type seen struct {
		req  idemgate.Request
		ok   bool
		body string
	}
	got := make(chan seen, 1)
	mw := idemhttp.New(idemhttp.Config{Store: newStore(t), Scope: scopeFromHeader,
		Skipper: func(r *http.Request) bool { return r.Header.Get("X-Skip") != "" }})
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, ok := idemhttp.FromRequest(r)
		b, _ := io.ReadAll(r.Body)
		got <- seen{req, ok, string(b)}
	}))
	send(t, h, http.MethodPost, "/x", "key-1", `{"q":1}`)
	s := <-got
	if !s.ok || s.req.Fingerprint == "" || s.req.Key.String() == "" || s.body != `{"q":1}` {
		t.Fatalf("handler saw %+v", s)
	}
	r := httptest.NewRequest(http.MethodPost, "/x", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "key-2")
	r.Header.Set("X-Skip", "1")
	h.ServeHTTP(httptest.NewRecorder(), r.WithContext(context.WithValue(r.Context(), ctxKey("k"), 1)))
	if s := <-got; s.ok {
		t.Fatalf("a skipped request carries a Request: %+v", s)
	}
}

// TestConfigErrors: New panics and ToMiddleware fails with an idemgate:
// error on a config without a Store or a Scope.
func TestConfigErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		cfg  idemhttp.Config
		want string
	}{
		{"no store", idemhttp.Config{Scope: scopeFromHeader}, "Store is required"},
		{"no scope", idemhttp.Config{Store: newStore(t)}, "Scope is required"},
		{"bad kind", idemhttp.Config{Store: newStore(t), Scope: scopeFromHeader, Kind: "Bad Kind"}, "Kind"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.cfg.ToMiddleware()
			if err == nil || !strings.HasPrefix(err.Error(), "idemgate: ") || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ToMiddleware: %v, want an idemgate: error naming %q", err, tt.want)
			}
			defer func() {
				if recover() == nil {
					t.Error("New did not panic")
				}
			}()
			idemhttp.New(tt.cfg)
		})
	}
}
