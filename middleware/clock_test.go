package middleware

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"
)

// fakeClock advances by step on every reading.
type fakeClock struct {
	mu   sync.Mutex
	t    time.Time
	step time.Duration
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(c.step)
	return c.t
}

// TestInjectedClock: event latencies and the WaitInFlight deadline come
// from the injected clock, not the wall clock.
func TestInjectedClock(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0), step: time.Hour}
	var (
		mu     sync.Mutex
		events []Event
	)
	entered, release := make(chan struct{}), make(chan struct{})
	e := echo.New()
	e.POST("/v1/images", func(c echo.Context) error {
		close(entered)
		<-release
		return c.NoContent(http.StatusCreated)
	}, mustMiddleware(t, clock.now, Config{
		Store:        NewRedisStore(client),
		Scope:        func(echo.Context) (string, string, error) { return "acme", "alice", nil },
		WaitInFlight: 90 * time.Minute, // two clock readings: one poll, then past the deadline
		OnEvent: func(_ context.Context, ev Event) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, ev)
		},
	}))
	send := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/v1/images", strings.NewReader(`{}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", "k")
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, r)
		return rec
	}
	done := make(chan struct{})
	go func() { send(); close(done) }()
	<-entered
	rec := send() // waits by the fake clock, which runs out at once
	close(release)
	<-done
	if rec.Code != http.StatusConflict {
		t.Fatalf("waiter got %d, want 409 once the injected clock passed WaitInFlight", rec.Code)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, ev := range events {
		if ev.Latency%time.Hour != 0 || ev.Latency <= 0 {
			t.Errorf("%v latency %v is not from the injected clock", ev.Type, ev.Latency)
		}
	}
}

// mustMiddleware is New on the clock now.
func mustMiddleware(t *testing.T, now func() time.Time, cfg Config) echo.MiddlewareFunc {
	t.Helper()
	mw, err := cfg.toMiddleware(now)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}
