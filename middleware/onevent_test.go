package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
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
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/redisstore"
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
		Store: redisstore.New(client),
		Scope: testScope,
		OnEvent: func(context.Context, idemgate.Event) {
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

type eventValueKey struct{}

// TestOnEventContext: every event of a request gets the request's
// context values, and an event after the client left (the release of its
// claim) gets a context that is not canceled, so a hook that logs or
// records with it still does. The lease renewal's events get the
// renewal's context, with the same values.
func TestOnEventContext(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	type seen struct {
		typ      idemgate.EventType
		value    any
		canceled bool
	}
	var (
		mu     sync.Mutex
		events []seen
	)
	store := &lostExtend{Store: redisstore.New(client), extended: make(chan struct{})}
	e := echo.New()
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			ctx, cancel := context.WithCancel(context.WithValue(c.Request().Context(), eventValueKey{}, c.Request().Header.Get("X-Id")))
			defer cancel()
			c.Set("cancel", cancel)
			c.SetRequest(c.Request().WithContext(ctx))
			return next(c)
		}
	})
	e.Use(middleware.New(middleware.Config{
		Store: store,
		Scope: testScope,
		Lease: 30 * time.Millisecond, // renewed every 10ms
		OnEvent: func(ctx context.Context, ev idemgate.Event) {
			mu.Lock()
			defer mu.Unlock()
			if ev.Type == idemgate.EventLeaseLost && ctx.Value(eventValueKey{}) == "fast" {
				// A loaded machine may run the fast handler past a
				// renewal (10 ms); only the slow one must see one.
				return
			}
			events = append(events, seen{ev.Type, ctx.Value(eventValueKey{}), ctx.Err() != nil})
		},
	}))
	e.POST("/v1/orders", func(c echo.Context) error {
		if c.Request().Header.Get("X-Id") == "slow" {
			select {
			case <-store.extended: // a renewal ran, and found its lease lost
			case <-time.After(30 * time.Second):
				t.Error("no renewal with the slow request's values within 30 s")
			}
		}
		c.Get("cancel").(context.CancelFunc)() // the client leaves
		return c.NoContent(http.StatusServiceUnavailable)
	})
	for _, id := range []string{"fast", "slow"} {
		r := req{path: "/v1/orders", key: id, body: `{}`}.build()
		r.Header.Set("X-Id", id)
		e.ServeHTTP(httptest.NewRecorder(), r)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []seen{
		{idemgate.EventClaimed, "fast", false}, {idemgate.EventReleased, "fast", false},
		{idemgate.EventClaimed, "slow", false}, {idemgate.EventLeaseLost, "slow", false},
	}
	if len(events) < len(want) {
		t.Fatalf("events %+v, want %+v then the release", events, want)
	}
	for i, w := range want {
		if events[i] != w {
			t.Errorf("event %d = %+v, want %+v", i, events[i], w)
		}
	}
}

// lostExtend is a Store whose extends find the lease lost, and say so
// once on extended for a request whose context holds eventValueKey
// "slow" (the renewal's context has the request's values).
type lostExtend struct {
	idemgate.Store
	extended chan struct{}
	once     sync.Once
}

func (s *lostExtend) Extend(ctx context.Context, _ string, _ idemgate.Token, _ time.Duration) error {
	if ctx.Value(eventValueKey{}) == "slow" {
		defer s.once.Do(func() { close(s.extended) })
	}
	return idemgate.ErrLeaseLost
}
