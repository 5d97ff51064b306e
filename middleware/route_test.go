package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/redisstore"
)

// callCounter counts every call to a Store, and a TxStore's Begin.
type callCounter struct {
	idemgate.Store
	calls atomic.Int64
}

func (s *callCounter) Claim(ctx context.Context, key string, r idemgate.ClaimRequest) (idemgate.ClaimResult, error) {
	s.calls.Add(1)
	return s.Store.Claim(ctx, key, r)
}

func (s *callCounter) Extend(ctx context.Context, key string, token idemgate.Token, lease time.Duration) error {
	s.calls.Add(1)
	return s.Store.Extend(ctx, key, token, lease)
}

func (s *callCounter) Complete(ctx context.Context, key string, token idemgate.Token, resp idemgate.Response, retention time.Duration) error {
	s.calls.Add(1)
	return s.Store.Complete(ctx, key, token, resp, retention)
}

func (s *callCounter) Release(ctx context.Context, key string, token idemgate.Token) error {
	s.calls.Add(1)
	return s.Store.Release(ctx, key, token)
}

// TestUnroutedRequestCostsNothing: with the middleware on the whole app, a
// keyed request that echo matches to no route of its method (a 404, a
// 405, a group's catch-all, echo's own OPTIONS answer) passes through to
// echo untouched: no store call, no key_missing, echo's own status. It
// claimed and released a key (two store calls) for each.
func TestUnroutedRequestCostsNothing(t *testing.T) {
	t.Parallel()
	ok := func(c echo.Context) error { return c.String(http.StatusCreated, "made") }
	tests := []struct {
		name       string
		given      func(e *echo.Echo, mw echo.MiddlewareFunc)
		methods    []string // Config.Methods
		when       req
		wantStatus int
		wantCalls  int64
	}{
		{name: "matched route is claimed and completed (the control)",
			given: func(e *echo.Echo, mw echo.MiddlewareFunc) { e.Use(mw); e.POST("/v1/images", ok) },
			when:  req{path: "/v1/images", key: "k"}, wantStatus: 201, wantCalls: 2},
		{name: "no route at all",
			given: func(e *echo.Echo, mw echo.MiddlewareFunc) { e.Use(mw); e.POST("/v1/images", ok) },
			when:  req{path: "/nope/1", key: "k"}, wantStatus: 404},
		{name: "no route, key missing on a Required app: 404, not key_missing",
			given: func(e *echo.Echo, mw echo.MiddlewareFunc) { e.Use(mw); e.POST("/v1/images", ok) },
			when:  req{path: "/nope/1"}, wantStatus: 404},
		{name: "path of another method: 405",
			given:   func(e *echo.Echo, mw echo.MiddlewareFunc) { e.Use(mw); e.GET("/v1/images", ok) },
			methods: []string{http.MethodPost, http.MethodPatch, http.MethodHead},
			when:    req{method: http.MethodPatch, path: "/v1/images", key: "k"}, wantStatus: 405},
		{name: "HEAD of a GET route is not routed to it (echo v4)",
			given:   func(e *echo.Echo, mw echo.MiddlewareFunc) { e.Use(mw); e.GET("/v1/images", ok) },
			methods: []string{http.MethodHead},
			when:    req{method: http.MethodHead, path: "/v1/images", key: "k"}, wantStatus: 405},
		{name: "OPTIONS answered by echo itself",
			given:   func(e *echo.Echo, mw echo.MiddlewareFunc) { e.Use(mw); e.POST("/v1/images", ok) },
			methods: []string{http.MethodPost, http.MethodOptions},
			when:    req{method: http.MethodOptions, path: "/v1/images", key: "k"}, wantStatus: 204},
		{name: "group with middleware: its catch-all 404",
			given: func(e *echo.Echo, mw echo.MiddlewareFunc) {
				g := e.Group("/v1")
				g.Use(mw)
				g.POST("/images", ok)
			},
			when: req{path: "/v1/nope", key: "k"}, wantStatus: 404},
		{name: "group with middleware: its route is claimed",
			given: func(e *echo.Echo, mw echo.MiddlewareFunc) {
				g := e.Group("/v1", mw)
				g.POST("/images", ok)
			},
			when: req{path: "/v1/images", key: "k"}, wantStatus: 201, wantCalls: 2},
		{name: "the app's RouteNotFound handler",
			given: func(e *echo.Echo, mw echo.MiddlewareFunc) {
				e.Use(mw)
				e.POST("/v1/images", ok)
				e.RouteNotFound("/*", func(c echo.Context) error { return c.NoContent(http.StatusNotFound) })
			},
			when: req{path: "/v1/nope", key: "k"}, wantStatus: 404},
		{name: "a POST route on the RouteNotFound path is claimed",
			given: func(e *echo.Echo, mw echo.MiddlewareFunc) {
				e.Use(mw)
				e.POST("/files/*", ok)
				e.RouteNotFound("/files/*", func(c echo.Context) error { return c.NoContent(http.StatusNotFound) })
			},
			when: req{path: "/files/a/b", key: "k"}, wantStatus: 201, wantCalls: 2},
		{name: "before routing (e.Pre): no route",
			given: func(e *echo.Echo, mw echo.MiddlewareFunc) { e.Pre(mw); e.POST("/v1/images", ok) },
			when:  req{path: "/nope", key: "k"}, wantStatus: 404},
		{name: "before routing (e.Pre): 405",
			given: func(e *echo.Echo, mw echo.MiddlewareFunc) { e.Pre(mw); e.GET("/v1/images", ok) },
			when:  req{path: "/v1/images", key: "k"}, wantStatus: 405},
		{name: "before routing (e.Pre): a route is claimed",
			given: func(e *echo.Echo, mw echo.MiddlewareFunc) { e.Pre(mw); e.POST("/v1/images", ok) },
			when:  req{path: "/v1/images", key: "k"}, wantStatus: 201, wantCalls: 2},
		{name: "host router: a route of another host's router is not this one's",
			given: func(e *echo.Echo, mw echo.MiddlewareFunc) {
				e.Use(mw)
				e.Host("api.example.com").POST("/v1/images", ok)
			},
			when: req{path: "/v1/images", key: "k"}, wantStatus: 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			mr := miniredis.RunT(t)
			client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			t.Cleanup(func() { client.Close() })
			store := &callCounter{Store: redisstore.New(client)}
			e := echo.New()
			tt.given(e, middleware.New(middleware.Config{Store: store, Scope: testScope, Required: true, Methods: tt.methods}))
			rec := httptest.NewRecorder()
			e.ServeHTTP(rec, tt.when.build())
			if rec.Code != tt.wantStatus || store.calls.Load() != tt.wantCalls {
				t.Errorf("%s %s = %d with %d store calls (%s), want %d with %d",
					tt.when.method, tt.when.path, rec.Code, store.calls.Load(), rec.Body, tt.wantStatus, tt.wantCalls)
			}
		})
	}
}

// TestRouteAddedAfterA404IsProtected: a 404 is not remembered, so a route
// registered after a 404 for its path is protected from its first request.
func TestRouteAddedAfterA404IsProtected(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	store := &callCounter{Store: redisstore.New(client)}
	e := echo.New()
	e.Use(middleware.New(middleware.Config{Store: store, Scope: testScope}))
	send := func() int {
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req{path: "/v1/late", key: "k"}.build())
		return rec.Code
	}
	if got := send(); got != http.StatusNotFound {
		t.Fatalf("before the route: %d, want 404", got)
	}
	e.POST("/v1/late", func(c echo.Context) error { return c.String(http.StatusCreated, "made") })
	if got := send(); got != http.StatusCreated || store.calls.Load() != 2 {
		t.Fatalf("after the route: %d with %d store calls, want 201 with a claim and a completion", got, store.calls.Load())
	}
	if rec := httptest.NewRecorder(); true {
		e.ServeHTTP(rec, req{path: "/v1/late", key: "k"}.build())
		if rec.Header().Get("Idempotent-Replayed") != "true" {
			t.Errorf("the retry was not replayed: %d %s", rec.Code, rec.Body)
		}
	}
}

// TestUnroutedAtomicRequestOpensNoTransaction: on an Atomic app (e.Use), a
// request matched to no route opens no transaction.
func TestUnroutedAtomicRequestOpensNoTransaction(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	s := &txStore{Store: redisstore.New(client)}
	e := echo.New()
	e.Use(middleware.New(middleware.Config{Store: s, Scope: testScope, Atomic: true}))
	e.GET("/v1/images", func(c echo.Context) error { return c.String(http.StatusOK, "list") })
	for _, r := range []req{{method: http.MethodGet, path: "/nope"}, {path: "/nope", key: "k"}, {path: "/v1/images", key: "k"}} {
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, r.build())
		if rec.Code/100 != 4 {
			t.Errorf("%s %s = %d, want echo's 404 or 405", r.method, r.path, rec.Code)
		}
	}
	if n := s.begun.Load(); n != 0 {
		t.Errorf("%d transactions begun for requests matched to no route, want 0", n)
	}
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, req{method: http.MethodGet, path: "/v1/images"}.build())
	if rec.Code != http.StatusOK || s.begun.Load() != 1 {
		t.Errorf("GET /v1/images = %d with %d transactions, want 200 in one", rec.Code, s.begun.Load())
	}
}
