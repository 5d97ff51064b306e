package idemgate

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
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
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0), step: time.Hour}
	var (
		mu     sync.Mutex
		events []Event
	)
	entered, release := make(chan struct{}), make(chan struct{})
	m, err := newEngine(EngineConfig{
		Store:        newMemStore(),
		WaitInFlight: 90 * time.Minute, // two clock readings: one poll, then past the deadline
		OnEvent: func(_ context.Context, ev Event) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, ev)
		},
	}, clock.now)
	if err != nil {
		t.Fatal(err)
	}
	d := &testDoor{template: "/v1/images", h: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(entered)
		<-release
		w.WriteHeader(http.StatusCreated)
	})}
	send := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/v1/images", strings.NewReader(`{}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", "k")
		rec := httptest.NewRecorder()
		_ = m.Serve(rec, r, d, nil, nil)
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
