package doortest

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemgate/idemgate"
)

// server is one server of a case: the door's handler, the suite's routes
// and a record of what happened.
type server struct {
	h      http.Handler
	tenant string
	calls  atomic.Int64 // handler runs
	events recorder
}

// handlerFunc is what a case's routes do; n counts the runs from 1.
type handlerFunc func(w http.ResponseWriter, r *http.Request, n int64)

// routes are the suite's routes: three methods of one path, another
// path, and a path with a wildcard.
var routes = []struct{ method, pattern string }{
	{http.MethodPost, "/v1/images"},
	{http.MethodPut, "/v1/images"},
	{http.MethodGet, "/v1/images"},
	{http.MethodPost, "/v1/videos"},
	{http.MethodPost, "/v1/orders/{id}/refund"},
}

// serve builds a server through the door: the Config of the case
// (configure changes it) on the bundle's store, every route running h
// (nil: defaultHandler).
func (b bundle) serve(t *testing.T, configure func(*Config), h handlerFunc) *server {
	t.Helper()
	s := &server{tenant: newTenant()}
	cfg := Config{Store: b.store, Scope: headerScope, OnEvent: s.events.add}
	if configure != nil {
		configure(&cfg)
	}
	if h == nil {
		h = defaultHandler
	}
	setup := Setup{Config: cfg}
	for _, r := range routes {
		setup.Routes = append(setup.Routes, Route{Method: r.method, Pattern: r.pattern,
			Handler: func(w http.ResponseWriter, r *http.Request) { h(w, r, s.calls.Add(1)) }})
	}
	s.h = b.door.New(t, setup)
	if s.h == nil {
		t.Fatal("doortest: Door.New returned no handler")
	}
	return s
}

// headerScope stands in for an auth layer: the tenant and user come from
// headers the suite sets.
func headerScope(r *http.Request) (string, string, error) {
	tenant, user := r.Header.Get("X-Tenant"), r.Header.Get("X-User")
	if tenant == "" || user == "" {
		return "", "", errors.New("doortest: no X-Tenant or X-User")
	}
	return tenant, user, nil
}

// defaultHandler answers 201 with a JSON body echoing the request body
// and the run, a header of its own and a cookie (never replayed).
func defaultHandler(w http.ResponseWriter, r *http.Request, n int64) {
	body, _ := io.ReadAll(r.Body)
	run := strconv.FormatInt(n, 10)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Run", run)
	w.Header().Set("Set-Cookie", "session=secret")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(`{"run":` + run + `,"got":` + string(body) + `}`))
}

// answer is a handler that answers status and body as text.
func answer(status int, body string) handlerFunc {
	return func(w http.ResponseWriter, _ *http.Request, n int64) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body+" "+strconv.FormatInt(n, 10))
	}
}

const imageBody = `{"prompt":"a red fox","aspect_ratio":"16:9","n":1}`

// req is one request of a case.
type req struct {
	method, path   string // default POST /v1/images
	key            string // "" omits the header
	keys           []string
	header         string // the key's header; default Idempotency-Key
	user           string // default alice
	otherTenant    bool   // a tenant of this server's other than its own
	ctype          string // default application/json
	acceptEncoding string
	body           string
	chunked        bool // unknown length
}

func (r req) build(s *server) *http.Request {
	if r.method == "" {
		r.method = http.MethodPost
	}
	if r.path == "" {
		r.path = "/v1/images"
	}
	var body io.Reader = strings.NewReader(r.body)
	if r.chunked {
		body = io.MultiReader(strings.NewReader(r.body))
	}
	hr := httptest.NewRequest(r.method, r.path, body)
	if r.chunked {
		hr.ContentLength = -1
	}
	header := or(r.header, "Idempotency-Key")
	if r.key != "" {
		hr.Header.Set(header, r.key)
	}
	for _, k := range r.keys {
		hr.Header.Add(header, k)
	}
	// Every tenant is the server's own, never a constant: a store of
	// TEST_REDIS_URL is shared by every case and every run.
	tenant := s.tenant
	if r.otherTenant {
		tenant += "-other"
	}
	hr.Header.Set("X-Tenant", tenant)
	hr.Header.Set("X-User", or(r.user, "alice"))
	hr.Header.Set("Content-Type", or(r.ctype, "application/json"))
	if r.acceptEncoding != "" {
		hr.Header.Set("Accept-Encoding", r.acceptEncoding)
	}
	return hr
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// do sends r and returns the answer; a panic out of the server fails the
// test (try is for a case that expects one).
func (s *server) do(t *testing.T, r req) *httptest.ResponseRecorder {
	t.Helper()
	rec, p := s.try(s.h, r.build(s))
	if p != nil {
		t.Errorf("the server panicked with %v", p)
	}
	return rec
}

// try serves hr through h and returns the answer and what h panicked
// with, if it did.
func (s *server) try(h http.Handler, hr *http.Request) (rec *httptest.ResponseRecorder, panicked any) {
	rec = httptest.NewRecorder()
	defer func() { panicked = recover() }()
	h.ServeHTTP(rec, hr)
	return rec, nil
}

// newServer serves h on a real loopback server for the test.
func newServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// recorder collects events.
type recorder struct {
	mu     sync.Mutex
	events []idemgate.Event
}

func (r *recorder) add(_ context.Context, e idemgate.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// String lists the events' types, each with its reason in brackets:
// "claimed,released(not_cacheable)".
func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.events))
	for _, e := range r.events {
		s := e.Type.String()
		if e.Reason != "" {
			s += "(" + e.Reason + ")"
		}
		out = append(out, s)
	}
	return strings.Join(out, ",")
}

// problem is a problem document as the suite reads it.
type problem struct {
	Type    string   `json:"type"`
	Title   string   `json:"title"`
	Status  int      `json:"status"`
	Detail  string   `json:"detail"`
	Code    string   `json:"code"`
	Changed []string `json:"changed"`
}

// problemOf checks an answer that is a problem document and returns it;
// the zero problem for an answer that is not one. Every problem says
// whether a retry can succeed (x-should-retry), when (Retry-After, if it
// can) and that it must not be cached.
func problemOf(t *testing.T, rec *httptest.ResponseRecorder) problem {
	t.Helper()
	if !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/problem+json") {
		return problem{}
	}
	var p problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem document %q: %v", rec.Body, err)
	}
	code := idemgate.Code(p.Code)
	if p.Type != "https://github.com/idemgate/idemgate#"+p.Code || p.Status != rec.Code || p.Title == "" || p.Detail == "" {
		t.Errorf("problem document %s with status %d: want its type, title, detail, and the answer's status", rec.Body, rec.Code)
	}
	retry := rec.Header().Get("X-Should-Retry")
	if want := strconv.FormatBool(code.Retryable()); retry != want {
		t.Errorf("%s answered with x-should-retry %q, want %q", code, retry, want)
	}
	if (retry == "true") != (rec.Header().Get("Retry-After") != "") {
		t.Errorf("%s answered with x-should-retry %q and Retry-After %q", code, retry, rec.Header().Get("Retry-After"))
	}
	if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
		t.Errorf("%s answered with Cache-Control %q, want no-store", code, cc)
	}
	return p
}

// want is what a case expects of an answer and of the server after it.
type want struct {
	status   int
	code     string // problem code, "" for none
	calls    int64
	replayed bool
	body     string // checked when set
	events   string // checked when set; noEvents for none
}

// noEvents is want.events for a request the middleware did not touch.
const noEvents = "(none)"

func (w want) check(t *testing.T, s *server, rec *httptest.ResponseRecorder) {
	t.Helper()
	if rec.Code != w.status {
		t.Errorf("status = %d, want %d; body %s", rec.Code, w.status, rec.Body)
	}
	if got := problemOf(t, rec).Code; got != w.code {
		t.Errorf("problem code = %q, want %q", got, w.code)
	}
	if got := s.calls.Load(); got != w.calls {
		t.Errorf("handler ran %d times, want %d", got, w.calls)
	}
	if got := rec.Header().Get("Idempotent-Replayed") == "true"; got != w.replayed {
		t.Errorf("replayed = %v, want %v", got, w.replayed)
	}
	if w.body != "" && rec.Body.String() != w.body {
		t.Errorf("body = %q, want %q", rec.Body, w.body)
	}
	if w.events != "" {
		if got := s.events.String(); got != strings.TrimPrefix(w.events, noEvents) {
			t.Errorf("events = %s, want %s", got, w.events)
		}
	}
}
