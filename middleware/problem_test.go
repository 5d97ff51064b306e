package middleware_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/redisstore"
)

// TestCodeRetryable: the retry hint of every code, as the wire contract
// lists it: only a request still running, a store outage, a lost lease, a
// body that did not arrive in time and a transaction that conflicted at
// its commit can end otherwise on a retry with the same key.
func TestCodeRetryable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		given idemgate.Code
		want  bool
	}{
		{idemgate.CodeKeyReused, false},
		{idemgate.CodeKeyMissing, false},
		{idemgate.CodeKeyInvalid, false},
		{idemgate.CodeScopeInvalid, false},
		{idemgate.CodeBodyInvalid, false},
		{idemgate.CodeBodyTooLarge, false},
		{idemgate.CodeEncodingNotAcceptable, false},
		{idemgate.CodeResponseTooLarge, false},
		{idemgate.CodeRequestInProgress, true},
		{idemgate.CodeStoreUnavailable, true},
		{idemgate.CodeLeaseLost, true},
		{idemgate.CodeBodyTimeout, true},
		{idemgate.CodeTxConflict, true},
		{idemgate.CodeTxAborted, false},
		{idemgate.Code("made_up"), false},
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
	var got []idemgate.Problem
	entered, release := make(chan struct{}), make(chan struct{})
	v := newEnv(t, func(c *middleware.Config) {
		c.Fingerprint = fingerprint.Spec{Fields: []string{"/prompt", "/n"}}
		c.MismatchStatus = http.StatusUnprocessableEntity
		c.ErrorHandler = func(c echo.Context, p idemgate.Problem) error {
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
	want := []idemgate.Problem{
		{Status: 422, Code: idemgate.CodeKeyReused, Title: "Idempotency key reused",
			Detail:  "This idempotency key was already used with other request parameters. Send a new key for new parameters.",
			Changed: []string{"/prompt"}},
		{Status: 409, Code: idemgate.CodeRequestInProgress, Title: "Request in progress",
			Detail: "A request with this idempotency key is still running; retry later.", RetryAfter: 10 * time.Second},
	}
	if !slices.EqualFunc(got, want, func(a, b idemgate.Problem) bool {
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
		given      func(c echo.Context, p idemgate.Problem) error
		wantStatus int
		wantBody   string // prefix
	}{
		{name: "returns nil without writing: the default problem",
			given:      func(echo.Context, idemgate.Problem) error { return nil },
			wantStatus: 409, wantBody: `{"type":"https://github.com/idemgate/idemgate#key_reused"`},
		{name: "writes twice: the first answer only",
			given: func(c echo.Context, p idemgate.Problem) error {
				_ = c.String(p.Status, "first")
				return c.String(http.StatusOK, "second")
			},
			wantStatus: 409, wantBody: "firstsecond"}, // echo keeps the status; the body is the handler's own doing
		{name: "returns an error: echo's error handler answers it",
			given: func(echo.Context, idemgate.Problem) error {
				return echo.NewHTTPError(http.StatusTeapot, "envelope broke")
			},
			wantStatus: http.StatusTeapot, wantBody: `{"message":"envelope broke"}`},
		{name: "returns a plain error: 500",
			given:      func(echo.Context, idemgate.Problem) error { return errors.New("boom") },
			wantStatus: 500, wantBody: `{"message":"Internal Server Error"}`},
		{name: "panics: echo's Recover answers 500",
			given:      func(echo.Context, idemgate.Problem) error { panic("envelope bug") },
			wantStatus: 500},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := newEnv(t, func(c *middleware.Config) { c.ErrorHandler = tt.given }, func(c echo.Context, n int64) error {
				if strings.Contains(c.Request().Header.Get("X-Mode"), "reused") {
					return idemgate.ErrKeyReused // the handler's own store found the key taken
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

// timeoutBody is a request body whose read runs into the server's read
// deadline after its first bytes, as net/http's does (*net.OpError
// wrapping os.ErrDeadlineExceeded).
type timeoutBody struct{ sent bool }

func (b *timeoutBody) Read(p []byte) (int, error) {
	if !b.sent {
		b.sent = true
		return copy(p, `{"prompt":`), nil
	}
	return 0, &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
}

func (*timeoutBody) Close() error { return nil }

// TestEveryAnswerHintAgrees walks every path on which the middleware
// writes an answer of its own (every problem code, and the Atomic
// route's commit and rollback outcomes) and checks what a client's retry
// logic reads: a problem document (application/problem+json, with the
// code, the status and the type that names the code), and a hint that
// agrees with it: x-should-retry: false without Retry-After, or
// x-should-retry: true with a Retry-After of whole seconds; true for a
// Retryable code, false for any other (but response_too_large, whose
// hint is the handler's status's). Every Code constant of the package
// must be walked.
func TestEveryAnswerHintAgrees(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	holding := func(c echo.Context, n int64) error {
		if n == 1 {
			close(entered)
			<-release
		}
		return defaultHandler(c, n)
	}
	big := strings.Repeat("x", 2048)
	tests := []struct {
		name      string
		given     func(*middleware.Config)
		atomic    bool
		store     func(*txStore)
		handler   handlerFunc
		first     *req // sent (and answered) before the request under test
		when      func(*env) *httptest.ResponseRecorder
		status    int
		code      idemgate.Code // "" for an answer that is not a problem
		retry     bool
		retryWait string // Retry-After when retry, "" for any
	}{
		{name: "key missing", given: func(c *middleware.Config) { c.Required = true },
			when: func(v *env) *httptest.ResponseRecorder { return v.do(req{body: imageBody}) }, status: 400, code: "key_missing"},
		{name: "key repeated",
			when: func(v *env) *httptest.ResponseRecorder { return v.do(req{keys: []string{"a", "b"}, body: imageBody}) }, status: 400, code: "key_invalid"},
		{name: "scope unusable",
			when: func(v *env) *httptest.ResponseRecorder {
				return v.do(req{key: "k", user: strings.Repeat("u", 300), body: imageBody})
			}, status: 400, code: "scope_invalid"},
		{name: "body too large", given: func(c *middleware.Config) { c.MaxBodyBytes = 8 },
			when: func(v *env) *httptest.ResponseRecorder { return v.do(req{key: "k", body: imageBody}) }, status: 413, code: "body_too_large"},
		{name: "body not JSON", given: func(c *middleware.Config) { c.Fingerprint = fingerprint.Spec{Fields: []string{"/prompt"}} },
			when: func(v *env) *httptest.ResponseRecorder { return v.do(req{key: "k", body: `{"prompt":`}) }, status: 400, code: "body_invalid"},
		{name: "body short of its length",
			when: func(v *env) *httptest.ResponseRecorder {
				r := req{key: "k", body: "only ten b"}.build()
				r.ContentLength = 100
				rec := httptest.NewRecorder()
				v.e.ServeHTTP(rec, r)
				return rec
			}, status: 400, code: "body_invalid"},
		{name: "body read timed out",
			when: func(v *env) *httptest.ResponseRecorder {
				r := req{key: "k"}.build()
				r.Body, r.ContentLength = &timeoutBody{}, 100
				rec := httptest.NewRecorder()
				v.e.ServeHTTP(rec, r)
				return rec
			}, status: 408, code: "body_timeout", retry: true, retryWait: "1"},
		{name: "request in progress", handler: holding,
			when: func(v *env) *httptest.ResponseRecorder {
				done := make(chan struct{})
				go func() { defer close(done); v.do(req{key: "k", body: imageBody}) }()
				<-entered
				rec := v.do(req{key: "k", body: imageBody})
				close(release)
				<-done
				return rec
			}, status: 409, code: "request_in_progress", retry: true},
		{name: "key reused", first: &req{key: "k", body: `{"a":1}`},
			when: func(v *env) *httptest.ResponseRecorder { return v.do(req{key: "k", body: `{"a":2}`}) }, status: 409, code: "key_reused"},
		{name: "handler's store found the key reused", handler: func(echo.Context, int64) error { return idemgate.ErrKeyReused },
			when: func(v *env) *httptest.ResponseRecorder { return v.do(req{key: "k", body: imageBody}) }, status: 409, code: "key_reused"},
		{name: "stored encoding not acceptable",
			handler: func(c echo.Context, n int64) error {
				c.Response().Header().Set("Content-Encoding", "br")
				return c.Blob(http.StatusCreated, "text/plain", []byte("not really brotli"))
			},
			when: func(v *env) *httptest.ResponseRecorder {
				first := req{key: "k", body: imageBody}.build()
				first.Header.Set("Accept-Encoding", "br")
				v.e.ServeHTTP(httptest.NewRecorder(), first)
				retry := req{key: "k", body: imageBody}.build()
				retry.Header.Set("Accept-Encoding", "br;q=0, *")
				rec := httptest.NewRecorder()
				v.e.ServeHTTP(rec, retry)
				return rec
			}, status: 406, code: "encoding_not_acceptable"},
		{name: "store unavailable",
			store: func(s *txStore) { s.Store = redisstore.New(closedRedis(t)) },
			when:  func(v *env) *httptest.ResponseRecorder { return v.do(req{key: "k", body: imageBody}) }, status: 503, code: "store_unavailable", retry: true, retryWait: "1"},
		{name: "atomic: begin fails", atomic: true, store: func(s *txStore) { s.beginErr = errors.New("no connection") },
			when: func(v *env) *httptest.ResponseRecorder { return v.do(req{key: "k", body: imageBody}) }, status: 503, code: "store_unavailable", retry: true, retryWait: "1"},
		{name: "atomic: commit outcome unknown", atomic: true, store: func(s *txStore) { s.commitErr = errors.New("connection reset") },
			when: func(v *env) *httptest.ResponseRecorder { return v.do(req{key: "k", body: imageBody}) }, status: 503, code: "store_unavailable", retry: true, retryWait: "1"},
		{name: "atomic: lease lost", atomic: true, store: func(s *txStore) { s.loseNext.Store(true) },
			when: func(v *env) *httptest.ResponseRecorder { return v.do(req{key: "k", body: imageBody}) }, status: 503, code: "lease_lost", retry: true, retryWait: "1"},
		{name: "atomic: commit conflict", atomic: true,
			store: func(s *txStore) { s.commitErr = fmt.Errorf("pgrecords: commit: %w: 40001", idemgate.ErrTxConflict) },
			when:  func(v *env) *httptest.ResponseRecorder { return v.do(req{key: "k", body: imageBody}) }, status: 503, code: "transaction_conflict", retry: true, retryWait: "1"},
		{name: "atomic: commit conflict without a key", atomic: true,
			store: func(s *txStore) { s.commitErr = fmt.Errorf("pgrecords: commit: %w: 40001", idemgate.ErrTxConflict) },
			when:  func(v *env) *httptest.ResponseRecorder { return v.do(req{body: imageBody}) }, status: 503, code: "transaction_conflict", retry: true, retryWait: "1"},
		{name: "atomic: handler broke its transaction, seen at commit", atomic: true,
			store: func(s *txStore) { s.commitErr = fmt.Errorf("pgrecords: commit: %w", idemgate.ErrTxAborted) },
			when:  func(v *env) *httptest.ResponseRecorder { return v.do(req{key: "k", body: imageBody}) }, status: 500, code: "transaction_aborted"},
		{name: "atomic: handler broke its transaction, seen at rollback", atomic: true,
			store:   func(s *txStore) { s.rollbackErr = fmt.Errorf("pgrecords: rollback: %w", idemgate.ErrTxAborted) },
			handler: func(echo.Context, int64) error { return errors.New("the handler failed") },
			when:    func(v *env) *httptest.ResponseRecorder { return v.do(req{key: "k", body: imageBody}) }, status: 500, code: "transaction_aborted"},
		{name: "atomic: handler broke its transaction, no key", atomic: true,
			store: func(s *txStore) { s.commitErr = fmt.Errorf("pgrecords: commit: %w", idemgate.ErrTxAborted) },
			when:  func(v *env) *httptest.ResponseRecorder { return v.do(req{body: imageBody}) }, status: 500, code: "transaction_aborted"},
		{name: "atomic: database refused the commit", atomic: true,
			store: func(s *txStore) { s.commitErr = fmt.Errorf("pgrecords: commit: %w: 23503", idemgate.ErrTxRefused) },
			when:  func(v *env) *httptest.ResponseRecorder { return v.do(req{key: "k", body: imageBody}) }, status: 500},
		{name: "atomic: answer too large to store", atomic: true,
			handler: func(c echo.Context, n int64) error { return c.String(http.StatusCreated, big) },
			when:    func(v *env) *httptest.ResponseRecorder { return v.do(req{key: "k", body: imageBody}) }, status: 500, code: "response_too_large"},
		{name: "atomic: 503 with Retry-After too large to hold", atomic: true,
			handler: func(c echo.Context, n int64) error {
				c.Response().Header().Set("Retry-After", "2")
				return c.String(http.StatusServiceUnavailable, big)
			},
			when: func(v *env) *httptest.ResponseRecorder { return v.do(req{key: "k", body: imageBody}) }, status: 503, code: "response_too_large", retry: true, retryWait: "2"},
		{name: "atomic: 429 without Retry-After too large to hold", atomic: true,
			handler: func(c echo.Context, n int64) error { return c.String(http.StatusTooManyRequests, big) },
			when:    func(v *env) *httptest.ResponseRecorder { return v.do(req{key: "k", body: imageBody}) }, status: 429, code: "response_too_large", retry: true, retryWait: "1"},
		{name: "atomic: 409 too large to hold", atomic: true,
			handler: func(c echo.Context, n int64) error { return c.String(http.StatusConflict, big) },
			when:    func(v *env) *httptest.ResponseRecorder { return v.do(req{key: "k", body: imageBody}) }, status: 409, code: "response_too_large"},
		{name: "atomic: 503 with an HTTP-date Retry-After too large to hold", atomic: true,
			handler: func(c echo.Context, n int64) error {
				c.Response().Header().Set("Retry-After", "Wed, 21 Oct 2015 07:28:00 GMT")
				return c.String(http.StatusServiceUnavailable, big)
			},
			when: func(v *env) *httptest.ResponseRecorder { return v.do(req{key: "k", body: imageBody}) }, status: 503, code: "response_too_large", retry: true, retryWait: "1"},
	}
	seen := map[idemgate.Code]bool{}
	for _, tt := range tests {
		seen[tt.code] = true
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var v *env
			if tt.atomic || tt.store != nil {
				mr := miniredis.RunT(t)
				client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
				t.Cleanup(func() { client.Close() })
				s := &txStore{Store: redisstore.New(client)}
				if tt.store != nil {
					tt.store(s)
				}
				v = newEnvOn(t, mr, client, s, func(c *middleware.Config) {
					c.Atomic = tt.atomic
					c.MaxResponseBytes = 1024
					if tt.given != nil {
						tt.given(c)
					}
				}, tt.handler)
			} else {
				v = newEnv(t, tt.given, tt.handler)
			}
			if tt.first != nil {
				v.do(*tt.first)
			}
			rec := tt.when(v)
			if rec.Code != tt.status {
				t.Errorf("status = %d, want %d; body %s", rec.Code, tt.status, rec.Body)
			}
			checkHint(t, rec, tt.retry, tt.retryWait)
			var doc struct {
				Type   string `json:"type"`
				Status int    `json:"status"`
				Code   string `json:"code"`
			}
			isProblem := rec.Header().Get("Content-Type") == "application/problem+json"
			switch {
			case tt.code == "" && isProblem:
				t.Errorf("a problem document %s, want the handler's error answer", rec.Body)
			case tt.code == "":
			case !isProblem:
				t.Errorf("Content-Type = %q, want application/problem+json; body %s", rec.Header().Get("Content-Type"), rec.Body)
			case json.Unmarshal(rec.Body.Bytes(), &doc) != nil:
				t.Errorf("problem document is not JSON: %s", rec.Body)
			case doc.Code != string(tt.code) || doc.Status != rec.Code || !strings.HasSuffix(doc.Type, "#"+string(tt.code)):
				t.Errorf("problem document %s, want code %s and status %d", rec.Body, tt.code, rec.Code)
			}
			if tt.code != "" && tt.code != idemgate.CodeResponseTooLarge && tt.code.Retryable() != tt.retry {
				t.Errorf("%s.Retryable() = %v, but the answer says x-should-retry %v", tt.code, tt.code.Retryable(), tt.retry)
			}
		})
	}
	for _, code := range declaredCodes(t) {
		if !seen[code] {
			t.Errorf("code %s is declared but no path here answers it", code)
		}
	}
}

// checkHint checks that rec tells a client whether to retry, and when:
// x-should-retry false without Retry-After, or true with one (want, when
// set, exactly).
func checkHint(t *testing.T, rec *httptest.ResponseRecorder, retry bool, want string) {
	t.Helper()
	should, after := rec.Header().Get("X-Should-Retry"), rec.Header().Get("Retry-After")
	if should != strconv.FormatBool(retry) {
		t.Errorf("x-should-retry = %q, want %v", should, retry)
	}
	switch {
	case !retry && after != "":
		t.Errorf("x-should-retry false with Retry-After %q", after)
	case retry && after == "":
		t.Errorf("x-should-retry true without Retry-After")
	case retry && want != "" && after != want:
		t.Errorf("Retry-After = %q, want %q", after, want)
	case retry:
		if n, err := strconv.Atoi(after); err != nil || n < 1 {
			t.Errorf("Retry-After = %q, want whole seconds", after)
		}
	}
}

// declaredCodes returns every constant of type Code declared in the
// root package's problem.go: a code added without a path in the walk above
// fails it.
func declaredCodes(t *testing.T) []idemgate.Code {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", "problem.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var codes []idemgate.Code
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
				continue
			}
			for _, v := range vs.Values {
				lit, ok := v.(*ast.BasicLit)
				if !ok {
					t.Fatalf("a Code constant that is not a literal: %T", v)
				}
				s, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				codes = append(codes, idemgate.Code(s))
			}
		}
	}
	if len(codes) < 11 {
		t.Fatalf("found %d Code constants in problem.go, want every one", len(codes))
	}
	return codes
}
