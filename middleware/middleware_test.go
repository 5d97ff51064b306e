package middleware_test

import (
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	echomw "github.com/labstack/echo/v4/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/wait"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/redisstore"
)

// testScope is a stand-in for an auth layer: tenant and user come from
// headers the test sets.
func testScope(c echo.Context) (string, string, error) {
	tenant, user := c.Request().Header.Get("X-Tenant"), c.Request().Header.Get("X-User")
	if tenant == "" || user == "" {
		return "", "", echo.ErrUnauthorized
	}
	return tenant, user, nil
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

func (r *recorder) types() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		s := e.Type.String()
		if e.Reason != "" {
			s += "(" + e.Reason + ")"
		}
		out = append(out, s)
	}
	return out
}

// env is one echo with the middleware on miniredis.
type env struct {
	e      *echo.Echo
	mr     *miniredis.Miniredis
	client *redis.Client
	store  idemgate.Store
	events *recorder
	calls  atomic.Int64 // handler runs
}

// handlerFunc is what the test route does; nil means "201 with a JSON body
// echoing the request body and a counter".
type handlerFunc func(c echo.Context, n int64) error

func newEnv(t *testing.T, configure func(*middleware.Config), h handlerFunc) *env {
	t.Helper()
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	return newEnvOn(t, mr, client, redisstore.New(client), configure, h)
}

func newEnvOn(t *testing.T, mr *miniredis.Miniredis, client *redis.Client, store idemgate.Store, configure func(*middleware.Config), h handlerFunc) *env {
	t.Helper()
	v := &env{e: echo.New(), mr: mr, client: client, store: store, events: &recorder{}}
	cfg := middleware.Config{Store: store, Scope: testScope, OnEvent: v.events.add}
	if configure != nil {
		configure(&cfg)
	}
	mw, err := cfg.ToMiddleware()
	if err != nil {
		t.Fatalf("ToMiddleware: %v", err)
	}
	if h == nil {
		h = defaultHandler
	}
	handler := func(c echo.Context) error { return h(c, v.calls.Add(1)) }
	v.e.Use(echomw.Recover())
	v.e.POST("/v1/images", handler, mw)
	v.e.POST("/v1/videos", handler, mw)
	v.e.PUT("/v1/images", handler, mw)
	v.e.GET("/v1/images", handler, mw)
	v.e.POST("/v1/orders/:id/refund", handler, mw)
	return v
}

func defaultHandler(c echo.Context, n int64) error {
	body, _ := io.ReadAll(c.Request().Body)
	c.Response().Header().Set("X-Run", strconv.FormatInt(n, 10))
	c.Response().Header().Set("Set-Cookie", "session=secret")
	return c.Blob(http.StatusCreated, "application/json", append([]byte(`{"run":`+strconv.FormatInt(n, 10)+`,"got":`), append(body, '}')...))
}

// req is one test request.
type req struct {
	method, path string
	key          string // "" omits the header
	keys         []string
	tenant, user string
	ctype        string
	body         string
	chunked      bool
}

func (r req) build() *http.Request {
	if r.method == "" {
		r.method = http.MethodPost
	}
	if r.path == "" {
		r.path = "/v1/images"
	}
	var body io.Reader = strings.NewReader(r.body)
	if r.chunked {
		body = io.MultiReader(strings.NewReader(r.body)) // unknown length
	}
	hr := httptest.NewRequest(r.method, r.path, body)
	if r.chunked {
		hr.ContentLength = -1
	}
	if r.key != "" {
		hr.Header.Set("Idempotency-Key", r.key)
	}
	for _, k := range r.keys {
		hr.Header.Add("Idempotency-Key", k)
	}
	hr.Header.Set("X-Tenant", or(r.tenant, "acme"))
	hr.Header.Set("X-User", or(r.user, "alice"))
	hr.Header.Set("Content-Type", or(r.ctype, "application/json"))
	return hr
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func (v *env) do(r req) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	v.e.ServeHTTP(rec, r.build())
	return rec
}

// problemCode extracts the "code" member of a problem+json answer.
func problemCode(t *testing.T, rec *httptest.ResponseRecorder) string {
	t.Helper()
	if !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/problem+json") {
		return ""
	}
	body := rec.Body.String()
	i := strings.Index(body, `"code":"`)
	if i < 0 {
		t.Fatalf("problem without code: %s", body)
	}
	rest := body[i+len(`"code":"`):]
	code := idemgate.Code(rest[:strings.IndexByte(rest, '"')])
	// Every problem says whether a retry can succeed, and a retryable one
	// says when (response_too_large with the handler's own status follows
	// that status: see TestEveryAnswerHintAgrees).
	retry := rec.Header().Get("X-Should-Retry")
	if want := strconv.FormatBool(code.Retryable()); retry != want && code != idemgate.CodeResponseTooLarge {
		t.Errorf("%s answered with x-should-retry %q, want %q", code, retry, want)
	}
	if (retry == "true") != (rec.Header().Get("Retry-After") != "") {
		t.Errorf("%s answered with x-should-retry %q and Retry-After %q", code, retry, rec.Header().Get("Retry-After"))
	}
	return string(code)
}

const imageBody = `{"prompt":"a red fox","aspect_ratio":"16:9","n":1}`

func TestRequestPath(t *testing.T) {
	t.Parallel()
	first := req{key: "req-1", body: imageBody}
	tests := []struct {
		name  string
		given func(*middleware.Config)
		h     handlerFunc
		setup []req // requests sent before, in order
		when  req
		want  want
	}{
		{name: "first request runs the handler", when: first,
			want: want{status: 201, calls: 1, body: `{"run":1,"got":` + imageBody + `}`, events: "claimed"}},
		{name: "identical retry replays byte for byte", setup: []req{first}, when: first,
			want: want{status: 201, calls: 1, replayed: true, body: `{"run":1,"got":` + imageBody + `}`, events: "claimed,replayed"}},
		{name: "retry with reordered keys and whitespace replays", setup: []req{first},
			when: req{key: "req-1", body: "{ \"n\":1, \"aspect_ratio\":\"16:9\",\n\"prompt\":\"a red fox\"}"},
			want: want{status: 201, calls: 1, replayed: true}},
		{name: "changed prompt is key_reused", setup: []req{first},
			when: req{key: "req-1", body: `{"prompt":"a red fox ","aspect_ratio":"16:9","n":1}`},
			want: want{status: 409, code: "key_reused", calls: 1, events: "claimed,reused"}},
		{name: "MismatchStatus 422", given: func(c *middleware.Config) { c.MismatchStatus = 422 }, setup: []req{first},
			when: req{key: "req-1", body: `{"prompt":"a blue fox"}`},
			want: want{status: 422, code: "key_reused", calls: 1}},
		{name: "excluded field does not matter",
			given: func(c *middleware.Config) { c.Fingerprint = fingerprint.Spec{Exclude: []string{"/client_note"}} },
			setup: []req{{key: "k", body: `{"prompt":"p","client_note":"a"}`}},
			when:  req{key: "k", body: `{"prompt":"p","client_note":"b"}`},
			want:  want{status: 201, calls: 1, replayed: true}},
		{name: "same key and body on another route runs", setup: []req{first},
			when: req{path: "/v1/videos", key: "req-1", body: imageBody},
			want: want{status: 201, calls: 2}},
		{name: "same key on another route with a shared Kind is key_reused",
			given: func(c *middleware.Config) { c.Kind = "media" }, setup: []req{first},
			when: req{path: "/v1/videos", key: "req-1", body: imageBody},
			want: want{status: 409, code: "key_reused", calls: 1}},
		{name: "same key from another user runs", setup: []req{first},
			when: req{key: "req-1", user: "bob", body: imageBody}, want: want{status: 201, calls: 2}},
		{name: "same key from another tenant runs", setup: []req{first},
			when: req{key: "req-1", tenant: "globex", body: imageBody}, want: want{status: 201, calls: 2}},
		{name: "tenant differing only in case runs", setup: []req{first},
			when: req{key: "req-1", tenant: "ACME", body: imageBody}, want: want{status: 201, calls: 2}},
		{name: "same bytes as text/plain is key_reused", setup: []req{first},
			when: req{key: "req-1", ctype: "text/plain", body: imageBody}, want: want{status: 409, code: "key_reused", calls: 1}},
		{name: "GET passes through", when: req{method: "GET", key: "req-1"}, setup: []req{{method: "GET", key: "req-1"}},
			want: want{status: 201, calls: 2}},
		{name: "PUT passes through by default", when: req{method: "PUT", key: "req-1", body: imageBody}, setup: []req{{method: "PUT", key: "req-1", body: imageBody}},
			want: want{status: 201, calls: 2}},
		{name: "PUT protected when listed", given: func(c *middleware.Config) { c.Methods = []string{"PUT"} },
			setup: []req{{method: "PUT", key: "req-1", body: imageBody}}, when: req{method: "PUT", key: "req-1", body: imageBody},
			want: want{status: 201, calls: 1, replayed: true}},
		{name: "skipper passes through", given: func(c *middleware.Config) { c.Skipper = func(echo.Context) bool { return true } },
			setup: []req{first}, when: first, want: want{status: 201, calls: 2}},
		{name: "no key passes through", setup: []req{{body: imageBody}}, when: req{body: imageBody},
			want: want{status: 201, calls: 2}},
		{name: "no key with Required is key_missing", given: func(c *middleware.Config) { c.Required = true },
			when: req{body: imageBody}, want: want{status: 400, code: "key_missing"}},
		{name: "custom header", given: func(c *middleware.Config) { c.Header = "X-Request-Id"; c.Required = true },
			when: req{key: "req-1", body: imageBody}, want: want{status: 400, code: "key_missing"}},
		{name: "repeated header is key_invalid", when: req{keys: []string{"a", "a"}, body: imageBody},
			want: want{status: 400, code: "key_invalid"}},
		{name: "256-byte key is key_invalid", when: req{key: strings.Repeat("k", 256), body: imageBody},
			want: want{status: 400, code: "key_invalid"}},
		{name: "255-byte key is fine", when: req{key: strings.Repeat("k", 255), body: imageBody},
			want: want{status: 201, calls: 1}},
		{name: "space in a bare key is key_invalid", when: req{key: "a b", body: imageBody},
			want: want{status: 400, code: "key_invalid"}},
		{name: "non-ASCII key is key_invalid", when: req{key: "clé", body: imageBody},
			want: want{status: 400, code: "key_invalid"}},
		{name: "sf-string key with space and escapes", when: req{key: `"a b \"c\""`, body: imageBody},
			want: want{status: 201, calls: 1}},
		{name: "sf-string and bare token of the same id are the same key",
			setup: []req{{key: `"req-1"`, body: imageBody}}, when: first,
			want: want{status: 201, calls: 1, replayed: true}},
		{name: "unterminated sf-string is key_invalid", when: req{key: `"abc`, body: imageBody},
			want: want{status: 400, code: "key_invalid"}},
		{name: "scope error is returned", when: req{key: "req-1", user: "-", body: imageBody},
			given: func(c *middleware.Config) {
				c.Scope = func(echo.Context) (string, string, error) { return "", "", echo.ErrUnauthorized }
			},
			want: want{status: 401}},
		{name: "declared body over MaxBodyBytes is body_too_large",
			given: func(c *middleware.Config) { c.MaxBodyBytes = 16 },
			when:  req{key: "req-1", body: imageBody}, want: want{status: 413, code: "body_too_large"}},
		{name: "chunked body over MaxBodyBytes is body_too_large",
			given: func(c *middleware.Config) { c.MaxBodyBytes = 16 },
			when:  req{key: "req-1", body: imageBody, chunked: true}, want: want{status: 413, code: "body_too_large"}},
		{name: "chunked body within the limit runs", when: req{key: "req-1", body: imageBody, chunked: true},
			want: want{status: 201, calls: 1, body: `{"run":1,"got":` + imageBody + `}`}},
		{name: "malformed JSON is body_invalid", when: req{key: "req-1", body: `{"prompt":`},
			want: want{status: 400, code: "body_invalid"}},
		{name: "duplicate JSON member is body_invalid", when: req{key: "req-1", body: `{"n":1,"n":2}`},
			want: want{status: 400, code: "body_invalid"}},
		{name: "empty JSON body runs", when: req{key: "req-1"},
			want: want{status: 201, calls: 1}},
		{name: "empty JSON body replays", setup: []req{{key: "req-1"}}, when: req{key: "req-1"},
			want: want{status: 201, calls: 1, replayed: true}},
		{name: "{} after an empty JSON body is key_reused", setup: []req{{key: "req-1"}}, when: req{key: "req-1", body: "{}"},
			want: want{status: 409, code: "key_reused", calls: 1}},
		{name: "empty body of another type runs", when: req{key: "req-1", ctype: "application/octet-stream"},
			want: want{status: 201, calls: 1}},
		{name: "5xx is released and the retry runs",
			h: func(c echo.Context, n int64) error {
				if n == 1 {
					return c.String(http.StatusBadGateway, "upstream down")
				}
				return defaultHandler(c, n)
			},
			setup: []req{first}, when: first,
			want: want{status: 201, calls: 2, events: "claimed,released(not_cacheable),claimed"}},
		{name: "429 is released",
			h:     func(c echo.Context, n int64) error { return c.String(http.StatusTooManyRequests, "slow down") },
			setup: []req{first}, when: first, want: want{status: 429, calls: 2}},
		{name: "4xx other than 408/409/425/429 is stored",
			h: func(c echo.Context, n int64) error {
				return c.String(http.StatusUnprocessableEntity, "bad prompt "+strconv.FormatInt(n, 10))
			},
			setup: []req{first}, when: first, want: want{status: 422, calls: 1, replayed: true, body: "bad prompt 1"}},
		{name: "custom Cacheable",
			given: func(c *middleware.Config) { c.Cacheable = func(status int) bool { return status == 201 } },
			h: func(c echo.Context, n int64) error {
				return c.String(http.StatusUnprocessableEntity, "bad prompt "+strconv.FormatInt(n, 10))
			},
			setup: []req{first}, when: first, want: want{status: 422, calls: 2, body: "bad prompt 2"}},
		{name: "handler error is released and returned",
			h: func(c echo.Context, n int64) error {
				if n == 1 {
					return echo.NewHTTPError(http.StatusServiceUnavailable, "busy")
				}
				return defaultHandler(c, n)
			},
			setup: []req{first}, when: first,
			want: want{status: 201, calls: 2, events: "claimed,released(handler_error),claimed"}},
		{name: "handler ErrKeyReused is key_reused",
			h: func(c echo.Context, n int64) error {
				if n == 1 {
					return idemgate.ErrKeyReused
				}
				return defaultHandler(c, n)
			},
			when: first, want: want{status: 409, code: "key_reused", calls: 1, events: "claimed,released(handler_error),reused"}},
		{name: "panic (answered by Recover) is released and the retry runs",
			h: func(c echo.Context, n int64) error {
				if n == 1 {
					panic("boom")
				}
				return defaultHandler(c, n)
			},
			setup: []req{first}, when: first,
			want: want{status: 201, calls: 2, events: "claimed,released(panic),claimed"}},
		{name: "handler writing nothing is stored as 200",
			h:     func(c echo.Context, n int64) error { return nil },
			setup: []req{first}, when: first, want: want{status: 200, calls: 1, replayed: true}},
		{name: "response over MaxResponseBytes streams through and is released",
			given: func(c *middleware.Config) { c.MaxResponseBytes = 8 },
			setup: []req{first}, when: first,
			want: want{status: 201, calls: 2, body: `{"run":2,"got":` + imageBody + `}`,
				events: "claimed,released(response_too_large),claimed,released(response_too_large)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := newEnv(t, tt.given, tt.h)
			for _, r := range tt.setup {
				v.do(r)
			}
			rec := v.do(tt.when)
			tt.want.check(t, v, rec)
		})
	}
}

type want struct {
	status   int
	code     string // problem code, "" for none
	calls    int64
	replayed bool
	body     string // checked when set
	events   string // comma-separated types, checked when set
}

func (w want) check(t *testing.T, v *env, rec *httptest.ResponseRecorder) {
	t.Helper()
	if rec.Code != w.status {
		t.Errorf("status = %d, want %d; body %s", rec.Code, w.status, rec.Body)
	}
	if got := problemCode(t, rec); got != w.code {
		t.Errorf("problem code = %q, want %q", got, w.code)
	}
	if got := v.calls.Load(); got != w.calls {
		t.Errorf("handler ran %d times, want %d", got, w.calls)
	}
	if got := rec.Header().Get("Idempotent-Replayed") == "true"; got != w.replayed {
		t.Errorf("replayed = %v, want %v", got, w.replayed)
	}
	if w.body != "" && rec.Body.String() != w.body {
		t.Errorf("body = %q, want %q", rec.Body, w.body)
	}
	if w.events != "" {
		if got := strings.Join(v.events.types(), ","); got != w.events {
			t.Errorf("events = %s, want %s", got, w.events)
		}
	}
}

// TestRequestTarget: path parameter values and the query string take part
// in the fingerprint, so one key never replays another order's answer.
func TestRequestTarget(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		given string // path of the first request
		when  string // path of the retry with the same key and body
		want  want
	}{
		{name: "other path parameter is key_reused", given: "/v1/orders/1/refund", when: "/v1/orders/2/refund",
			want: want{status: 409, code: "key_reused", calls: 1}},
		{name: "same path parameter replays", given: "/v1/orders/1/refund", when: "/v1/orders/1/refund",
			want: want{status: 201, calls: 1, replayed: true}},
		{name: "added query is key_reused", given: "/v1/images", when: "/v1/images?dry_run=true",
			want: want{status: 409, code: "key_reused", calls: 1}},
		{name: "other query value is key_reused", given: "/v1/images?dry_run=false", when: "/v1/images?dry_run=true",
			want: want{status: 409, code: "key_reused", calls: 1}},
		{name: "reordered query is key_reused", given: "/v1/images?a=1&b=2", when: "/v1/images?b=2&a=1",
			want: want{status: 409, code: "key_reused", calls: 1}},
		{name: "same query replays", given: "/v1/orders/1/refund?dry_run=true", when: "/v1/orders/1/refund?dry_run=true",
			want: want{status: 201, calls: 1, replayed: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := newEnv(t, nil, nil)
			if rec := v.do(req{path: tt.given, key: "k", body: imageBody}); rec.Code != 201 {
				t.Fatalf("first request = %d %s", rec.Code, rec.Body)
			}
			tt.want.check(t, v, v.do(req{path: tt.when, key: "k", body: imageBody}))
		})
	}
}

func TestProblemDocument(t *testing.T) {
	t.Parallel()
	v := newEnv(t, nil, nil)
	v.do(req{key: "k", body: `{"a":1}`})
	rec := v.do(req{key: "k", body: `{"a":2}`})
	want := `{"type":"https://github.com/idemgate/idemgate#key_reused","title":"Idempotency key reused","status":409,` +
		`"detail":"This idempotency key was already used with other request parameters. Send a new key for new parameters.","code":"key_reused"}` + "\n"
	if rec.Body.String() != want {
		t.Errorf("body =\n%s\nwant\n%s", rec.Body, want)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q", ct)
	}
	// Nothing of the stored response leaks into the conflict answer.
	if rec.Header().Get("X-Run") != "" || strings.Contains(rec.Body.String(), "run") {
		t.Errorf("key_reused answer leaks the stored response: %v %s", rec.Header(), rec.Body)
	}
}

func TestReplayHeaders(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		given []string
		want  http.Header // the headers a replay must have (and the rest must not)
		not   []string
	}{
		{name: "default drops Set-Cookie and Date", want: http.Header{"X-Run": {"1"}, "Content-Type": {"application/json"}},
			not: []string{"Set-Cookie", "Date", "X-Hop"}},
		{name: "allowlist", given: []string{"x-run"}, want: http.Header{"X-Run": {"1"}},
			not: []string{"Set-Cookie", "Content-Type"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := newEnv(t, func(c *middleware.Config) { c.ReplayHeaders = tt.given }, func(c echo.Context, n int64) error {
				h := c.Response().Header()
				h.Set("Date", "Mon, 01 Jan 2024 00:00:00 GMT")
				h.Set("Connection", "X-Hop")
				h.Set("X-Hop", "1")
				return defaultHandler(c, n)
			})
			v.do(req{key: "k", body: imageBody})
			rec := v.do(req{key: "k", body: imageBody})
			if rec.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("not a replay: %d %s", rec.Code, rec.Body)
			}
			for name, vals := range tt.want {
				if got := rec.Header().Values(name); strings.Join(got, "|") != strings.Join(vals, "|") {
					t.Errorf("%s = %q, want %q", name, got, vals)
				}
			}
			for _, name := range tt.not {
				if got := rec.Header().Get(name); got != "" {
					t.Errorf("%s replayed as %q", name, got)
				}
			}
		})
	}
}

// TestReplayHeadersAnyCase: header names are case-insensitive. A handler
// that writes non-canonical names straight into the header map
// ("set-cookie", "idempotent-replayed") gets the same filtering as with
// Header().Set: no Set-Cookie, Date, Content-Length, hop-by-hop header or
// Idempotent-Replayed of its own is replayed (a client would see the
// replay marker twice), and an allowlisted name is kept in any case.
func TestReplayHeadersAnyCase(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		given []string
		want  []string // names (any case) a replay must have
		not   []string // names (any case) it must not have
	}{
		{name: "default", want: []string{"X-Run", "x-mine"},
			not: []string{"Set-Cookie", "Date", "Content-Length", "X-Hop", "Keep-Alive"}},
		{name: "allowlist", given: []string{"X-Mine"}, want: []string{"x-mine"},
			not: []string{"Set-Cookie", "X-Run"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := newEnv(t, func(c *middleware.Config) { c.ReplayHeaders = tt.given }, func(c echo.Context, n int64) error {
				h := c.Response().Header()
				h["set-cookie"] = []string{"session=secret"}
				h["idempotent-replayed"] = []string{"false"}
				h["date"] = []string{"Mon, 01 Jan 2024 00:00:00 GMT"}
				h["content-length"] = []string{"1"}
				h["keep-alive"] = []string{"timeout=5"}
				h["connection"] = []string{"x-hop"}
				h["x-hop"] = []string{"1"}
				h["x-mine"] = []string{"m"}
				c.Response().Header().Set("X-Run", strconv.FormatInt(n, 10))
				return c.NoContent(http.StatusCreated)
			})
			v.do(req{key: "k", body: imageBody})
			rec := v.do(req{key: "k", body: imageBody})
			values := func(name string) (out []string) {
				for k, vs := range rec.Header() {
					if strings.EqualFold(k, name) {
						out = append(out, vs...)
					}
				}
				return out
			}
			if got := values("Idempotent-Replayed"); len(got) != 1 || got[0] != "true" {
				t.Fatalf("Idempotent-Replayed = %q, want one \"true\" (%d %v)", got, rec.Code, rec.Header())
			}
			for _, name := range tt.want {
				if len(values(name)) == 0 {
					t.Errorf("%s not replayed: %v", name, rec.Header())
				}
			}
			for _, name := range tt.not {
				if got := values(name); len(got) > 0 {
					t.Errorf("%s replayed as %q", name, got)
				}
			}
		})
	}
}

// TestReplayKeepsOuterHeaders: headers that middleware outside the
// idempotency middleware set (a request id) belong to each request: a
// replay carries the retry's own, plus the headers the handler set or
// changed.
func TestReplayKeepsOuterHeaders(t *testing.T) {
	t.Parallel()
	v := newEnv(t, nil, func(c echo.Context, n int64) error {
		c.Response().Header().Set("Cache-Control", "private")
		return defaultHandler(c, n)
	})
	v.e.Use(echomw.RequestID(), func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			c.Response().Header().Set("Cache-Control", "no-store")
			c.Response().Header().Set("X-Outer", c.Request().Header.Get(echo.HeaderXRequestID))
			return next(c)
		}
	})
	send := func(id string) *httptest.ResponseRecorder {
		r := req{key: "k", body: imageBody}.build()
		r.Header.Set(echo.HeaderXRequestID, id)
		rec := httptest.NewRecorder()
		v.e.ServeHTTP(rec, r)
		return rec
	}
	if rec := send("first"); rec.Header().Get(echo.HeaderXRequestID) != "first" {
		t.Fatalf("first answer: %d %v", rec.Code, rec.Header())
	}
	rec := send("second")
	if rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("not a replay: %d %s", rec.Code, rec.Body)
	}
	for name, want := range map[string]string{
		echo.HeaderXRequestID: "second",  // outer, per request
		"X-Outer":             "second",  // outer, per request
		"Cache-Control":       "private", // outer, changed by the handler
		"X-Run":               "1",       // the handler's
	} {
		if got := rec.Header().Values(name); len(got) != 1 || got[0] != want {
			t.Errorf("replayed %s = %q, want [%s]", name, got, want)
		}
	}
}

func TestFromContext(t *testing.T) {
	t.Parallel()
	var got []middleware.Request
	var oks []bool
	v := newEnv(t, nil, func(c echo.Context, n int64) error {
		r, ok := middleware.FromContext(c)
		got, oks = append(got, r), append(oks, ok)
		return c.NoContent(http.StatusAccepted)
	})
	v.do(req{key: "req-1", body: imageBody})
	v.do(req{key: "req-2", body: imageBody})
	v.do(req{body: imageBody})
	if len(got) != 3 || !oks[0] || !oks[1] || oks[2] {
		t.Fatalf("FromContext oks = %v", oks)
	}
	a, b := got[0], got[1]
	if a.Key.Kind() != "post-v1-images" || a.Key.Tenant() != "acme" {
		t.Errorf("key kind/tenant = %q/%q", a.Key.Kind(), a.Key.Tenant())
	}
	if a.Key == b.Key || a.Fingerprint != b.Fingerprint {
		t.Errorf("different ids must give different keys and the same fingerprint: %v %v", a, b)
	}
	if !strings.HasPrefix(string(a.Fingerprint), "v1:") || len(a.Fingerprint) != 67 {
		t.Errorf("fingerprint %q is not v1: + 64 hex", a.Fingerprint)
	}
	if strings.Contains(a.Key.String(), "req-1") || strings.Contains(a.Key.String(), "alice") {
		t.Errorf("key %q has the raw request id or user", a.Key)
	}
}

// TestInFlight: a second request while the first runs gets 409
// request_in_progress with Retry-After; with WaitInFlight it waits and
// replays.
func TestInFlight(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		given time.Duration
		want  want
	}{
		{name: "answer at once", want: want{status: 409, code: "request_in_progress", calls: 1}},
		{name: "wait and replay", given: time.Minute, want: want{status: 201, calls: 1, replayed: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			entered, release := make(chan struct{}), make(chan struct{})
			mr := miniredis.RunT(t)
			client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			t.Cleanup(func() { client.Close() })
			store := &countingStore{Store: redisstore.New(client)}
			v := newEnvOn(t, mr, client, store, func(c *middleware.Config) { c.WaitInFlight = tt.given }, func(c echo.Context, n int64) error {
				close(entered)
				<-release
				return defaultHandler(c, n)
			})
			done := make(chan *httptest.ResponseRecorder)
			go func() { done <- v.do(req{key: "k", body: imageBody}) }()
			<-entered
			second := make(chan *httptest.ResponseRecorder)
			go func() { second <- v.do(req{key: "k", body: imageBody}) }()
			if tt.given == 0 {
				rec := <-second
				// The lease has ~30 s left; Retry-After is capped at Lease/3.
				if got := rec.Header().Get("Retry-After"); got != "10" {
					t.Errorf("Retry-After = %q, want 10 (a third of the 30 s lease)", got)
				}
				close(release)
				<-done
				tt.want.check(t, v, rec)
				return
			}
			// Let the waiter poll at least once, then finish the holder.
			wait.For(t, 30*time.Second, "the waiter's polls", func() bool { return store.claims.Load() >= 3 })
			close(release)
			first := <-done
			rec := <-second
			tt.want.check(t, v, rec)
			if rec.Body.String() != first.Body.String() {
				t.Errorf("waited replay %q differs from the original %q", rec.Body, first.Body)
			}
		})
	}
}

// countingStore counts the calls to a Store.
type countingStore struct {
	idemgate.Store
	claims, extends atomic.Int64 // extends: the successful ones
	lost            atomic.Int64 // extends that found the lease lost
}

func (s *countingStore) Claim(ctx context.Context, key string, r idemgate.ClaimRequest) (idemgate.ClaimResult, error) {
	s.claims.Add(1)
	return s.Store.Claim(ctx, key, r)
}

// Extend counts the extends that succeeded (once they have) and those that
// found the lease lost.
func (s *countingStore) Extend(ctx context.Context, key string, token idemgate.Token, lease time.Duration) error {
	err := s.Store.Extend(ctx, key, token, lease)
	switch {
	case err == nil:
		s.extends.Add(1)
	case errors.Is(err, idemgate.ErrLeaseLost):
		s.lost.Add(1)
	}
	return err
}

// TestLeaseRenewal: the lease is extended while a slow handler runs, so a
// retry long after the original lease ran out is still 409 and the handler
// runs once.
func TestLeaseRenewal(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	store := &countingStore{Store: redisstore.New(client)}
	const lease = 300 * time.Millisecond
	v := newEnvOn(t, mr, client, store, func(c *middleware.Config) { c.Lease = lease }, func(c echo.Context, n int64) error {
		if n > 1 {
			// A retry got in: the claim expired. The check below says so.
			return defaultHandler(c, n)
		}
		// Fast forward 2/3 of a lease, three times (two leases in all), and
		// after each wait for a renewal that surely ran after it: the first
		// one counted may have started before the fast forward, the second
		// started after the first finished. Each pushes the TTL back to a
		// full lease; without renewals the claim would have expired.
		for range 3 {
			mr.FastForward(2 * lease / 3)
			seen := store.extends.Load()
			if !wait.Until(30*time.Second, func() bool { return store.extends.Load() >= seen+2 || store.lost.Load() > 0 }) {
				t.Errorf("no two renewals within 30 s")
				return errors.New("no renewals")
			}
			if store.lost.Load() > 0 {
				t.Errorf("the claim expired while the handler ran: a renewal found it gone")
				return errors.New("lease lost")
			}
		}
		rec := httptest.NewRecorder()
		c.Echo().ServeHTTP(rec, req{key: "k", body: imageBody}.build())
		if rec.Code != http.StatusConflict {
			t.Errorf("retry two leases later, during renewals = %d %s, want 409", rec.Code, rec.Body)
		}
		return defaultHandler(c, n)
	})
	rec := v.do(req{key: "k", body: imageBody})
	want{status: 201, calls: 1}.check(t, v, rec)
	if got := v.do(req{key: "k", body: imageBody}); got.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("after a renewed run the retry is %d, want a replay", got.Code)
	}
}

// TestCrashedHolder: a claim whose holder never completes blocks retries
// only for its lease; then one retry runs, and the stale holder cannot
// overwrite it.
func TestCrashedHolder(t *testing.T) {
	t.Parallel()
	v := newEnv(t, func(c *middleware.Config) { c.Lease = 10 * time.Second }, nil)
	// The "crashed" node: a request that claimed the key through the same
	// store and then vanished (no renewal, no completion).
	stale := idemgate.ClaimRequest{Lease: 10 * time.Second}
	var fp middleware.Request
	probe := newEnv(t, nil, func(c echo.Context, n int64) error {
		fp, _ = middleware.FromContext(c)
		return c.NoContent(204)
	})
	probe.do(req{key: "k", body: imageBody})
	stale.Fingerprint, stale.Owner, stale.Kind, stale.Token = fp.Fingerprint, fp.Key.Owner(), fp.Key.Kind(), idemgate.Token{1}
	ctx := context.Background()
	if res, err := v.store.Claim(ctx, fp.Key.String(), stale); err != nil || res.Status != idemgate.Claimed {
		t.Fatalf("stale claim = %v, %v", res.Status, err)
	}
	if rec := v.do(req{key: "k", body: imageBody}); rec.Code != 409 || problemCode(t, rec) != "request_in_progress" {
		t.Fatalf("during the lease: %d %s", rec.Code, rec.Body)
	}
	v.mr.FastForward(11 * time.Second)
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() { defer wg.Done(); v.do(req{key: "k", body: imageBody}) }()
	}
	wg.Wait()
	if got := v.calls.Load(); got != 1 {
		t.Errorf("after the lease the handler ran %d times, want 1", got)
	}
	if err := v.store.Complete(ctx, fp.Key.String(), stale.Token, idemgate.Response{Status: 500}, time.Hour); !errors.Is(err, idemgate.ErrLeaseLost) {
		t.Errorf("stale Complete = %v, want ErrLeaseLost", err)
	}
	if err := v.store.Release(ctx, fp.Key.String(), stale.Token); !errors.Is(err, idemgate.ErrLeaseLost) {
		t.Errorf("stale Release = %v, want ErrLeaseLost", err)
	}
	if rec := v.do(req{key: "k", body: imageBody}); rec.Header().Get("Idempotent-Replayed") != "true" || rec.Code != 201 {
		t.Errorf("replay after the stale holder's attempts = %d %s", rec.Code, rec.Body)
	}
}

// TestFlushedMidRequest: the store loses the claim while the handler runs;
// the client still gets its answer, a lease_lost event says so, and a retry
// runs again (nothing was stored).
func TestFlushedMidRequest(t *testing.T) {
	t.Parallel()
	var v *env
	v = newEnv(t, nil, func(c echo.Context, n int64) error {
		v.mr.FlushAll()
		return defaultHandler(c, n)
	})
	rec := v.do(req{key: "k", body: imageBody})
	want{status: 201, calls: 1, events: "claimed,lease_lost(complete)"}.check(t, v, rec)
	rec = v.do(req{key: "k", body: imageBody})
	if rec.Code != 201 || v.calls.Load() != 2 {
		t.Errorf("retry after a flush = %d, calls %d", rec.Code, v.calls.Load())
	}
}

// TestClientDisconnect: the client goes away while the handler runs; the
// response is still stored, so its retry replays.
func TestClientDisconnect(t *testing.T) {
	t.Parallel()
	v := newEnv(t, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	v.e.POST("/v1/disconnect", func(c echo.Context) error {
		cancel()
		return defaultHandler(c, v.calls.Add(1))
	}, middleware.New(middleware.Config{Store: v.store, Scope: testScope}))
	r := req{path: "/v1/disconnect", key: "k", body: imageBody}.build()
	v.e.ServeHTTP(httptest.NewRecorder(), r.WithContext(ctx))
	rec := v.do(req{path: "/v1/disconnect", key: "k", body: imageBody})
	if rec.Header().Get("Idempotent-Replayed") != "true" || v.calls.Load() != 1 {
		t.Errorf("retry after a disconnect = %d replayed=%q calls=%d", rec.Code, rec.Header().Get("Idempotent-Replayed"), v.calls.Load())
	}
}

// TestClientGoneBeforeClaim: a client that went away before its claim is
// no store outage: no store_error or fail_open event, the handler does not
// run, and no claim is left behind to block the client's retry.
func TestClientGoneBeforeClaim(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		client func(t *testing.T) *redis.Client // nil: a working miniredis
		events string
	}{
		{name: "working store", events: "released(canceled)"},
		{name: "dead store with FailOpen", client: closedRedis, events: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var v *env
			if tt.client == nil {
				v = newEnv(t, func(c *middleware.Config) { c.FailOpen = true }, nil)
			} else {
				client := tt.client(t)
				v = newEnvOn(t, nil, client, redisstore.New(client), func(c *middleware.Config) { c.FailOpen = true }, nil)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			v.e.ServeHTTP(httptest.NewRecorder(), req{key: "k", body: imageBody}.build().WithContext(ctx))
			if got := strings.Join(v.events.types(), ","); got != tt.events {
				t.Errorf("events = %q, want %q", got, tt.events)
			}
			if n := v.calls.Load(); n != 0 {
				t.Errorf("handler ran %d times for a client that was gone", n)
			}
			if tt.client == nil {
				if rec := v.do(req{key: "k", body: imageBody}); rec.Code != 201 || v.calls.Load() != 1 {
					t.Errorf("retry = %d %s, calls %d; want it to run at once", rec.Code, rec.Body, v.calls.Load())
				}
			}
		})
	}
}

// TestShortBody: a body shorter than its Content-Length (the client went
// away mid-body) never reaches the handler.
func TestShortBody(t *testing.T) {
	t.Parallel()
	v := newEnv(t, nil, nil)
	r := req{key: "k", ctype: "application/octet-stream", body: "only ten b"}.build()
	r.ContentLength = 100
	rec := httptest.NewRecorder()
	v.e.ServeHTTP(rec, r)
	want{status: 400, code: "body_invalid", calls: 0}.check(t, v, rec)
}

// TestPanicPropagates: a handler's panic releases the claim and goes on up
// the stack (here no Recover middleware swallows it), and a retry runs.
func TestPanicPropagates(t *testing.T) {
	t.Parallel()
	v := newEnv(t, nil, nil)
	mw := middleware.New(middleware.Config{Store: v.store, Scope: testScope, OnEvent: v.events.add})
	h := mw(func(c echo.Context) error {
		v.calls.Add(1)
		panic("boom")
	})
	c := v.e.NewContext(req{key: "k", body: imageBody}.build(), httptest.NewRecorder())
	c.SetPath("/v1/images")
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want the handler's panic \"boom\"", p)
			}
		}()
		_ = h(c)
	}()
	if got := strings.Join(v.events.types(), ","); got != "claimed,released(panic)" {
		t.Errorf("events = %s, want claimed,released(panic)", got)
	}
	if rec := v.do(req{key: "k", body: imageBody}); rec.Code != 201 || v.calls.Load() != 2 {
		t.Errorf("retry after a panic = %d %s, calls %d; want it to run", rec.Code, rec.Body, v.calls.Load())
	}
}

// headerCounter counts the WriteHeader calls that reach the server's writer.
type headerCounter struct {
	*httptest.ResponseRecorder
	writeHeaders int
}

func (w *headerCounter) WriteHeader(code int) {
	w.writeHeaders++
	w.ResponseRecorder.WriteHeader(code)
}

func (w *headerCounter) Unwrap() http.ResponseWriter { return w.ResponseRecorder }

// TestFlushOnly: a handler that only flushed has sent 200; the middleware
// must not write a second (superfluous) status after it, not even the
// key_reused answer for a handler's ErrKeyReused.
func TestFlushOnly(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		given  error // what the handler returns after flushing
		replay bool  // whether a retry replays
	}{
		{name: "stored as 200", replay: true},
		{name: "ErrKeyReused after a flush", given: idemgate.ErrKeyReused},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := newEnv(t, nil, func(c echo.Context, n int64) error {
				c.Response().Flush()
				return tt.given
			})
			w := &headerCounter{ResponseRecorder: httptest.NewRecorder()}
			v.e.ServeHTTP(w, req{key: "k", body: imageBody}.build())
			if w.Code != 200 || !w.Flushed || w.writeHeaders != 1 || w.Body.Len() != 0 {
				t.Errorf("status %d, flushed %v, WriteHeader called %d times, body %q; want 200, true, once, empty",
					w.Code, w.Flushed, w.writeHeaders, w.Body)
			}
			rec := v.do(req{key: "k", body: imageBody})
			if got := rec.Header().Get("Idempotent-Replayed") == "true"; got != tt.replay {
				t.Errorf("retry = %d replayed=%v, want replayed=%v", rec.Code, got, tt.replay)
			}
		})
	}
}

func TestFlushAndHijackPassThrough(t *testing.T) {
	t.Parallel()
	v := newEnv(t, nil, func(c echo.Context, n int64) error {
		c.Response().WriteHeader(http.StatusOK)
		if _, err := c.Response().Write([]byte("part1,")); err != nil {
			return err
		}
		if err := http.NewResponseController(c.Response()).Flush(); err != nil {
			return err
		}
		c.Response().Flush()
		_, err := c.Response().Write([]byte("part2"))
		return err
	})
	rec := v.do(req{key: "k", body: imageBody})
	if !rec.Flushed || rec.Body.String() != "part1,part2" {
		t.Fatalf("flushed=%v body=%q", rec.Flushed, rec.Body)
	}
	if rec := v.do(req{key: "k", body: imageBody}); rec.Body.String() != "part1,part2" || rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay of a flushed response = %q", rec.Body)
	}

	// Hijack through a real server: the connection is handed over, and the
	// claim is released rather than stored.
	released := make(chan struct{}, 2)
	hv := newEnv(t, func(c *middleware.Config) {
		record := c.OnEvent
		c.OnEvent = func(ctx context.Context, e idemgate.Event) {
			record(ctx, e)
			if e.Type == idemgate.EventReleased {
				released <- struct{}{}
			}
		}
	}, func(c echo.Context, n int64) error {
		conn, buf, err := http.NewResponseController(c.Response()).Hijack()
		if err != nil {
			return err
		}
		defer conn.Close()
		buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nhijacked")
		return buf.Flush()
	})
	srv := httptest.NewServer(hv.e)
	defer srv.Close()
	for i := range 2 {
		hr, _ := http.NewRequest("POST", srv.URL+"/v1/images", strings.NewReader(imageBody))
		hr.Header = req{key: "k"}.build().Header
		resp, err := srv.Client().Do(hr)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "hijacked" {
			t.Errorf("request %d body = %q", i, body)
		}
		// The client has its answer before the middleware releases the
		// claim; the next request must not race the release.
		select {
		case <-released:
		case <-time.After(10 * time.Second):
			t.Fatalf("request %d: no released event within 10 s", i)
		}
	}
	if hv.calls.Load() != 2 {
		t.Errorf("hijacked handler ran %d times, want 2 (never stored)", hv.calls.Load())
	}
}

// TestStoreDown: Redis closed, refusing connections, or too slow to answer.
func TestStoreDown(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		client   func(t *testing.T) *redis.Client
		failOpen bool
		want     want
	}{
		{name: "closed server fails closed", client: closedRedis,
			want: want{status: 503, code: "store_unavailable", events: "store_error(claim)"}},
		{name: "closed server fails open", client: closedRedis, failOpen: true,
			want: want{status: 201, calls: 1, events: "store_error(claim),fail_open"}},
		{name: "slow server fails closed", client: slowRedis,
			want: want{status: 503, code: "store_unavailable", events: "store_error(claim)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			client := tt.client(t)
			v := newEnvOn(t, nil, client, redisstore.New(client), func(c *middleware.Config) { c.FailOpen = tt.failOpen }, nil)
			rec := v.do(req{key: "k", body: imageBody})
			tt.want.check(t, v, rec)
			if rec.Code == 503 && rec.Header().Get("Retry-After") == "" {
				t.Errorf("503 without Retry-After")
			}
		})
	}
}

func closedRedis(t *testing.T) *redis.Client {
	mr := miniredis.RunT(t)
	addr := mr.Addr()
	mr.Close()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { c.Close() })
	return c
}

// slowRedis is a server that accepts connections and never answers.
func slowRedis(t *testing.T) *redis.Client {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, conn); conn.Close() }()
		}
	}()
	c := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), MaxRetries: -1,
		ReadTimeout: 50 * time.Millisecond, WriteTimeout: 50 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	return c
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	store := redisstore.New(redis.NewClient(&redis.Options{}))
	valid := func() middleware.Config { return middleware.Config{Store: store, Scope: testScope} }
	tests := []struct {
		name  string
		given func(*middleware.Config)
		want  string // substring of the error; "" for none
	}{
		{name: "valid", given: func(*middleware.Config) {}},
		{name: "no store", given: func(c *middleware.Config) { c.Store = nil }, want: "Store is required"},
		{name: "no scope", given: func(c *middleware.Config) { c.Scope = nil }, want: "Scope is required"},
		{name: "bad kind", given: func(c *middleware.Config) { c.Kind = "Image" }, want: "Kind"},
		{name: "bad pointer", given: func(c *middleware.Config) { c.Fingerprint.Fields = []string{"prompt"} }, want: "Fingerprint"},
		{name: "bad exclude", given: func(c *middleware.Config) { c.Fingerprint.Exclude = []string{"/a~2"} }, want: "Fingerprint"},
		{name: "negative lease", given: func(c *middleware.Config) { c.Lease = -time.Second }, want: "Lease"},
		{name: "sub-millisecond retention", given: func(c *middleware.Config) { c.Retention = time.Microsecond }, want: "Retention"},
		{name: "negative wait", given: func(c *middleware.Config) { c.WaitInFlight = -1 }, want: "WaitInFlight"},
		{name: "mismatch 200", given: func(c *middleware.Config) { c.MismatchStatus = 200 }, want: "MismatchStatus"},
		{name: "negative body limit", given: func(c *middleware.Config) { c.MaxBodyBytes = -1 }, want: "MaxBodyBytes"},
		{name: "negative response limit", given: func(c *middleware.Config) { c.MaxResponseBytes = -1 }, want: "MaxResponseBytes"},
		{name: "bad header", given: func(c *middleware.Config) { c.Header = "Idempotency Key" }, want: "Header"},
		{name: "bad method", given: func(c *middleware.Config) { c.Methods = []string{""} }, want: "Methods"},
		{name: "bad replay header", given: func(c *middleware.Config) { c.ReplayHeaders = []string{"a:b"} }, want: "ReplayHeaders"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := valid()
			tt.given(&cfg)
			_, err := cfg.ToMiddleware()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("ToMiddleware: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "idemgate: ") {
				t.Fatalf("ToMiddleware error = %v, want one starting idemgate: and mentioning %q", err, tt.want)
			}
			defer func() {
				p := recover()
				perr, ok := p.(error)
				if !ok || !strings.HasPrefix(perr.Error(), "idemgate: ") {
					t.Errorf("New panicked with %v, want an idemgate: error", p)
				}
			}()
			middleware.New(cfg)
		})
	}
}

func TestDefaultCacheable(t *testing.T) {
	t.Parallel()
	for status, want := range map[int]bool{200: true, 201: true, 202: true, 204: true, 301: true, 400: true, 404: true,
		408: false, 409: false, 422: true, 425: false, 429: false, 500: false, 502: false, 503: false} {
		if got := middleware.DefaultCacheable(status); got != want {
			t.Errorf("DefaultCacheable(%d) = %v, want %v", status, got, want)
		}
	}
}

// TestUnlimitedBody: MaxBodyBytes of math.MaxInt64 ("no limit") reads a
// body of unknown length to its end, so two bodies that differ after byte
// 512 get different fingerprints (a conflict, never a replay) and a JSON
// body over 512 bytes is whole; a Content-Length of math.MaxInt64 is
// answered 413 body_too_large.
func TestUnlimitedBody(t *testing.T) {
	t.Parallel()
	v := newEnv(t, func(c *middleware.Config) { c.MaxBodyBytes = math.MaxInt64 }, nil)
	pad := strings.Repeat("x", 600)
	first := `{"prompt":"` + pad + `","n":1}`
	want{status: 201, calls: 1}.check(t, v, v.do(req{key: "k", body: first, chunked: true}))
	want{status: 409, code: "key_reused", calls: 1}.check(t, v, v.do(req{key: "k", body: `{"prompt":"` + pad + `","n":2}`, chunked: true}))
	want{status: 201, calls: 1, replayed: true}.check(t, v, v.do(req{key: "k", body: first, chunked: true}))
	// Raw bodies: the bytes after 512 take part too.
	want{status: 201, calls: 2}.check(t, v, v.do(req{key: "raw", ctype: "text/plain", body: pad + "n=1", chunked: true}))
	want{status: 409, code: "key_reused", calls: 2}.check(t, v, v.do(req{key: "raw", ctype: "text/plain", body: pad + "n=2", chunked: true}))

	r := req{key: "huge", body: imageBody}.build()
	r.ContentLength = math.MaxInt64
	rec := httptest.NewRecorder()
	v.e.ServeHTTP(rec, r)
	want{status: 413, code: "body_too_large", calls: 2}.check(t, v, rec)
}

// stallingStore's first Extend stalls until its context ends, as a renewal
// does against a store that hangs for a while; the later ones are counted
// by countingStore.
type stallingStore struct {
	countingStore
	calls atomic.Int64
}

func (s *stallingStore) Extend(ctx context.Context, key string, token idemgate.Token, lease time.Duration) error {
	if s.calls.Add(1) == 1 {
		<-ctx.Done()
		return ctx.Err()
	}
	return s.countingStore.Extend(ctx, key, token, lease)
}

// TestLeaseRenewalAfterAStalledOneComesBeforeTheLeaseEnds: a renewal that
// stalls for its whole time (Lease/3) is tried again within the lease it
// was renewing (Lease/12 after), so a handler longer than a lease keeps its
// claim. Before,
// the next try came Lease/3 after the stalled one gave up, when the lease
// had just run out (the key's TTL here runs on the wall clock).
func TestLeaseRenewalAfterAStalledOneComesBeforeTheLeaseEnds(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	mr.ClockTTL(true)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	store := &stallingStore{countingStore: countingStore{Store: redisstore.New(client)}}
	// The retry comes a quarter of the lease before it ends: 2.25 s for a
	// loaded machine's late timers.
	const lease = 9 * time.Second
	v := newEnvOn(t, mr, client, store, func(c *middleware.Config) { c.Lease = lease }, func(c echo.Context, n int64) error {
		if !wait.Until(30*time.Second, func() bool { return store.extends.Load() > 0 || store.lost.Load() > 0 }) {
			t.Errorf("no renewal after the stalled one within 30 s")
		}
		if store.lost.Load() > 0 {
			t.Errorf("the renewal after the stalled one found the claim gone: it came after the lease ended")
		}
		return defaultHandler(c, n)
	})
	rec := v.do(req{key: "k", body: imageBody})
	want{status: 201, calls: 1}.check(t, v, rec)
	if store.calls.Load() < 2 {
		t.Errorf("%d renewals, want the stalled one and one after it", store.calls.Load())
	}
}

// failingExtend is a Store whose extends fail at once, as against a store
// that refuses connections.
type failingExtend struct {
	idemgate.Store
	calls atomic.Int64
}

func (s *failingExtend) Extend(context.Context, string, idemgate.Token, time.Duration) error {
	s.calls.Add(1)
	return errors.New("connection refused")
}

// TestRenewalsThatFailFastComeNoMoreOftenThanEveryThirdOfALease: a store
// that fails renewals at once gets them every Lease/3, as before a stalled
// renewal's retry was brought forward, not every Lease/12 (each failure is
// an event and a log line, against a store that is down).
func TestRenewalsThatFailFastComeNoMoreOftenThanEveryThirdOfALease(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	store := &failingExtend{Store: redisstore.New(client)}
	const lease = 600 * time.Millisecond
	v := newEnvOn(t, mr, client, store, func(c *middleware.Config) { c.Lease = lease }, func(c echo.Context, n int64) error {
		time.Sleep(2 * lease) // a late timer only makes fewer renewals
		return defaultHandler(c, n)
	})
	want{status: 201, calls: 1}.check(t, v, v.do(req{key: "k", body: imageBody}))
	if n := store.calls.Load(); n > 7 {
		t.Errorf("%d renewals in two leases, want at most 6 (every Lease/3) and one at the edge", n)
	}
}
