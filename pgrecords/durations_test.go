package pgrecords_test

import (
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/middleware"
)

// TestTinyDurations: a lease or retention of 1µs, zero or negative
// never makes a live record (the store rounds up to 1µs: it expires at
// once), and nothing errors.
func TestTinyDurations(t *testing.T) {
	t.Parallel()
	s := newStore(t, newPool(t, testenv.PostgresDSN(t)))
	for _, d := range []time.Duration{time.Nanosecond, 0, -time.Hour, math.MinInt64} {
		k := key()
		req := request(d)
		mustClaim(t, s, k, req, middleware.Claimed)
		time.Sleep(2 * time.Millisecond)
		r := request(time.Hour)
		mustClaim(t, s, k, r, middleware.Claimed)
		if err := s.Complete(testCtx(t), k, r.Token, sample(), d); err != nil {
			t.Errorf("Complete with retention %v: %v", d, err)
		}
		time.Sleep(2 * time.Millisecond)
		mustClaim(t, s, k, request(time.Hour), middleware.Claimed)
	}
}

// TestHugeDurations: a lease or retention of math.MaxInt64 ("for
// ever", the largest time.Duration) must keep the record live, as any
// other long duration does; a rounding overflow must not turn it into 1µs.
func TestHugeDurations(t *testing.T) {
	t.Parallel()
	pg := newStore(t, newPool(t, testenv.PostgresDSN(t)))
	rc := redis.NewClient(testenv.Redis(t)) // a real server: miniredis TTLs do not count down
	t.Cleanup(func() { rc.Close() })
	for name, s := range map[string]middleware.Store{"postgres": pg, "redis": middleware.NewRedisStore(rc)} {
		for _, d := range []time.Duration{math.MaxInt64, math.MaxInt64 - 1, 200 * 365 * 24 * time.Hour} {
			k := key()
			mustClaim(t, s, k, request(d), middleware.Claimed)
			time.Sleep(5 * time.Millisecond)
			if res, err := s.Claim(testCtx(t), k, request(time.Hour)); err != nil || res.Status != middleware.Running {
				t.Errorf("%s: lease %v: a second claim = %v, %v; want running", name, d, res.Status, err)
			}
			k = key()
			req := request(time.Hour)
			mustClaim(t, s, k, req, middleware.Claimed)
			if err := s.Complete(testCtx(t), k, req.Token, sample(), d); err != nil {
				t.Errorf("%s: Complete with retention %v: %v", name, d, err)
			}
			time.Sleep(5 * time.Millisecond)
			if res, err := s.Claim(testCtx(t), k, request(time.Hour)); err != nil || res.Status != middleware.Finished {
				t.Errorf("%s: retention %v: a retry = %v, %v; want finished (a replay)", name, d, res.Status, err)
			}
		}
	}
}

// TestRetentionForeverEndToEnd: Config.Retention of math.MaxInt64
// passes the middleware's validation; a retry must replay, not run the
// handler again.
func TestRetentionForeverEndToEnd(t *testing.T) {
	t.Parallel()
	s := newStore(t, newPool(t, testenv.PostgresDSN(t)))
	e, runs := e2e(t, s, middleware.Config{Retention: math.MaxInt64})
	for range 3 {
		send(e, "alice", "req-forever", []byte("once"))
		time.Sleep(5 * time.Millisecond)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("three sends of one request ran the handler %d times, want once (then replays)", n)
	}
}
