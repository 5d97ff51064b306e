package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	echomw "github.com/labstack/echo/v4/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/middleware"
)

// TestOnEventPanicDoesNotLockTheKey: a metrics hook that panics must not
// break the request path. It used to unwind through the middleware right
// after the claim, so echo's Recover answered 500 and the key stayed
// claimed: every retry got 409 request_in_progress for a whole lease.
func TestOnEventPanicDoesNotLockTheKey(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	var runs atomic.Int32
	e := echo.New()
	e.Use(echomw.Recover())
	e.Use(middleware.New(middleware.Config{
		Store: middleware.NewRedisStore(client),
		Scope: testScope,
		OnEvent: func(context.Context, middleware.Event) {
			panic("hook bug")
		},
	}))
	e.POST("/v1/orders", func(c echo.Context) error {
		runs.Add(1)
		return c.String(http.StatusCreated, "order 1")
	})
	for try := 1; try <= 2; try++ {
		r := httptest.NewRequest(http.MethodPost, "/v1/orders", strings.NewReader(`{"n":1}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", "order-1")
		r.Header.Set("X-Tenant", "acme")
		r.Header.Set("X-User", "alice")
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, r)
		if rec.Code != http.StatusCreated || rec.Body.String() != "order 1" {
			t.Fatalf("try %d: %d %q, want 201 %q", try, rec.Code, rec.Body, "order 1")
		}
		if try == 2 && rec.Header().Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry was not replayed")
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}
