package middleware_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/middleware"
)

// TestCodeRetryable: the retry hint of every code, as the wire contract
// lists it: only a request still running, a store outage and a lost lease
// can end otherwise on a retry with the same key.
func TestCodeRetryable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		given middleware.Code
		want  bool
	}{
		{middleware.CodeKeyReused, false},
		{middleware.CodeKeyMissing, false},
		{middleware.CodeKeyInvalid, false},
		{middleware.CodeScopeInvalid, false},
		{middleware.CodeBodyInvalid, false},
		{middleware.CodeBodyTooLarge, false},
		{middleware.CodeEncodingNotAcceptable, false},
		{middleware.CodeResponseTooLarge, false},
		{middleware.CodeRequestInProgress, true},
		{middleware.CodeStoreUnavailable, true},
		{middleware.CodeLeaseLost, true},
		{middleware.Code("made_up"), false},
	}
	for _, tt := range tests {
		if got := tt.given.Retryable(); got != tt.want {
			t.Errorf("%s.Retryable() = %v, want %v", tt.given, got, tt.want)
		}
	}
}

// TestErrorHandlerGetsTheProblem: the handler receives the problem as a
// value — status, code, title, detail, Retry-After, changed — and the
// retry headers are set before it runs.
func TestErrorHandlerGetsTheProblem(t *testing.T) {
	t.Parallel()
	var got []middleware.Problem
	entered, release := make(chan struct{}), make(chan struct{})
	v := newEnv(t, func(c *middleware.Config) {
		c.Fingerprint = fingerprint.Spec{Fields: []string{"/prompt", "/n"}}
		c.MismatchStatus = http.StatusUnprocessableEntity
		c.ErrorHandler = func(c echo.Context, p middleware.Problem) error {
			got = append(got, p)
			return c.JSON(p.Status, map[string]any{"error": string(p.Code), "retry": c.Response().Header().Get("X-Should-Retry")})
		}
	}, func(c echo.Context, n int64) error {
		if n == 2 {
			close(entered)
			<-release
		}
		return defaultHandler(c, n)
	})
	v.do(req{key: "a", body: `{"prompt":"fox","n":1}`})
	rec := v.do(req{key: "a", body: `{"prompt":"owl","n":1}`})
	if rec.Code != 422 || rec.Body.String() != `{"error":"key_reused","retry":"false"}`+"\n" ||
		rec.Header().Get("X-Should-Retry") != "false" || rec.Header().Get("Cache-Control") != "no-store" {
		t.Errorf("key_reused through the handler = %d %q %v", rec.Code, rec.Body, rec.Header())
	}
	done := make(chan struct{})
	go func() { defer close(done); v.do(req{key: "b", body: `{}`}) }()
	<-entered
	rec = v.do(req{key: "b", body: `{}`})
	close(release)
	<-done
	if rec.Code != 409 || rec.Header().Get("X-Should-Retry") != "true" || rec.Header().Get("Retry-After") == "" {
		t.Errorf("request_in_progress through the handler = %d %v", rec.Code, rec.Header())
	}
	want := []middleware.Problem{
		{Status: 422, Code: middleware.CodeKeyReused, Title: "Idempotency key reused",
			Detail:  "This idempotency key was already used with other request parameters. Send a new key for new parameters.",
			Changed: []string{"/prompt"}},
		{Status: 409, Code: middleware.CodeRequestInProgress, Title: "Request in progress",
			Detail: "A request with this idempotency key is still running; retry later.", RetryAfter: 10 * time.Second},
	}
	if !slices.EqualFunc(got, want, func(a, b middleware.Problem) bool {
		return a.Status == b.Status && a.Code == b.Code && a.Title == b.Title && a.Detail == b.Detail &&
			a.RetryAfter == b.RetryAfter && slices.Equal(a.Changed, b.Changed)
	}) {
		t.Errorf("ErrorHandler got\n%+v\nwant\n%+v", got, want)
	}
}

// TestCarelessErrorHandler: an ErrorHandler that writes nothing, writes
// twice, fails or panics never leaves a client with an empty 200, a mixed
// answer or a key held.
func TestCarelessErrorHandler(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		given      func(c echo.Context, p middleware.Problem) error
		wantStatus int
		wantBody   string // prefix
	}{
		{name: "returns nil without writing: the default problem",
			given:      func(echo.Context, middleware.Problem) error { return nil },
			wantStatus: 409, wantBody: `{"type":"https://github.com/idemgate/idemgate#key_reused"`},
		{name: "writes twice: the first answer only",
			given: func(c echo.Context, p middleware.Problem) error {
				_ = c.String(p.Status, "first")
				return c.String(http.StatusOK, "second")
			},
			wantStatus: 409, wantBody: "firstsecond"}, // echo keeps the status; the body is the handler's own doing
		{name: "returns an error: echo's error handler answers it",
			given: func(echo.Context, middleware.Problem) error {
				return echo.NewHTTPError(http.StatusTeapot, "envelope broke")
			},
			wantStatus: http.StatusTeapot, wantBody: `{"message":"envelope broke"}`},
		{name: "returns a plain error: 500",
			given:      func(echo.Context, middleware.Problem) error { return errors.New("boom") },
			wantStatus: 500, wantBody: `{"message":"Internal Server Error"}`},
		{name: "panics: echo's Recover answers 500",
			given:      func(echo.Context, middleware.Problem) error { panic("envelope bug") },
			wantStatus: 500},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := newEnv(t, func(c *middleware.Config) { c.ErrorHandler = tt.given }, func(c echo.Context, n int64) error {
				if strings.Contains(c.Request().Header.Get("X-Mode"), "reused") {
					return middleware.ErrKeyReused // the handler's own store found the key taken
				}
				return defaultHandler(c, n)
			})
			r := req{key: "k", body: `{"a":1}`}.build()
			r.Header.Set("X-Mode", "reused")
			rec := httptest.NewRecorder()
			v.e.ServeHTTP(rec, r)
			if rec.Code != tt.wantStatus || !strings.HasPrefix(rec.Body.String(), tt.wantBody) {
				t.Errorf("key_reused = %d %q, want %d %q…", rec.Code, rec.Body, tt.wantStatus, tt.wantBody)
			}
			if rec.Header().Get("X-Should-Retry") != "false" {
				t.Errorf("x-should-retry = %q, want false whatever the handler did", rec.Header().Get("X-Should-Retry"))
			}
			// The claim was released before the handler ran: the same
			// request runs again at once.
			if rec := v.do(req{key: "k", body: `{"a":1}`}); rec.Code != http.StatusCreated {
				t.Errorf("retry after the ErrorHandler = %d %s, want 201: the key is held", rec.Code, rec.Body)
			}
		})
	}
}
