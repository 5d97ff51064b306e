package doortest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/wait"
)

// countingStore counts the claims a store gets.
type countingStore struct {
	idemgate.Store
	claims atomic.Int64
}

func (s *countingStore) Claim(ctx context.Context, key string, r idemgate.ClaimRequest) (idemgate.ClaimResult, error) {
	s.claims.Add(1)
	return s.Store.Claim(ctx, key, r)
}

// testInFlight: a retry while the first request runs is answered 409
// request_in_progress at once, with a Retry-After of a third of the lease
// (10 s of the default 30 s: a Lease of 3 s makes it 1 s); with WaitInFlight it waits for the
// first and replays its answer.
func testInFlight(t *testing.T, b bundle) {
	tests := []struct {
		name  string
		given time.Duration // WaitInFlight
		lease time.Duration
		retry string // Retry-After of request_in_progress
		want  want
	}{
		{name: "a retry is request_in_progress with Retry-After", retry: "10",
			want: want{status: 409, code: "request_in_progress", calls: 1}},
		{name: "Retry-After is a third of Lease", lease: 3 * time.Second, retry: "1",
			want: want{status: 409, code: "request_in_progress", calls: 1}},
		{name: "with WaitInFlight a retry waits and replays", given: time.Minute, want: want{status: 201, calls: 1, replayed: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			entered, release := make(chan struct{}), make(chan struct{})
			store := &countingStore{Store: b.store}
			s := b.serve(t, func(c *Config) { c.Store = store; c.WaitInFlight = tt.given; c.Lease = tt.lease }, func(w http.ResponseWriter, r *http.Request, n int64) {
				if n == 1 {
					close(entered)
					<-release
				}
				defaultHandler(w, r, n)
			})
			released := false
			defer func() {
				if !released {
					close(release)
				}
			}()
			done := make(chan *httptest.ResponseRecorder, 1)
			go func() { done <- s.do(t, req{key: "k", body: imageBody}) }()
			select {
			case <-entered:
			case <-time.After(30 * time.Second):
				t.Fatal("the first request's handler did not start within 30 s")
			}
			second := make(chan *httptest.ResponseRecorder, 1)
			go func() { second <- s.do(t, req{key: "k", body: imageBody}) }()
			if tt.given == 0 {
				rec := <-second
				if got := rec.Header().Get("Retry-After"); got != tt.retry {
					t.Errorf("Retry-After = %q, want %s (a third of the lease, which has most of its time left)", got, tt.retry)
				}
				tt.want.check(t, s, rec)
				if got := s.events.String(); got != "claimed,in_progress" {
					t.Errorf("events = %s, want claimed,in_progress", got)
				}
				released = true
				close(release)
				<-done
				return
			}
			// Let the waiter poll at least once, then finish the holder.
			wait.For(t, 30*time.Second, "the waiter's polls", func() bool { return store.claims.Load() >= 3 })
			released = true
			close(release)
			first := <-done
			rec := <-second
			tt.want.check(t, s, rec)
			if rec.Body.String() != first.Body.String() {
				t.Errorf("waited replay %q differs from the original %q", rec.Body, first.Body)
			}
		})
	}
}
