package pgrecords_test

import (
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/redisstore"
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
		mustClaim(t, s, k, req, idemgate.Claimed)
		time.Sleep(2 * time.Millisecond)
		r := request(time.Hour)
		mustClaim(t, s, k, r, idemgate.Claimed)
		if err := s.Complete(testCtx(t), k, r.Token, sample(), d); err != nil {
			t.Errorf("Complete with retention %v: %v", d, err)
		}
		time.Sleep(2 * time.Millisecond)
		mustClaim(t, s, k, request(time.Hour), idemgate.Claimed)
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
	for name, s := range map[string]idemgate.Store{"postgres": pg, "redis": redisstore.New(rc)} {
		for _, d := range []time.Duration{math.MaxInt64, math.MaxInt64 - 1, 200 * 365 * 24 * time.Hour} {
			k := key()
			mustClaim(t, s, k, request(d), idemgate.Claimed)
			time.Sleep(5 * time.Millisecond)
			if res, err := s.Claim(testCtx(t), k, request(time.Hour)); err != nil || res.Status != idemgate.Running {
				t.Errorf("%s: lease %v: a second claim = %v, %v; want running", name, d, res.Status, err)
			}
			k = key()
			req := request(time.Hour)
			mustClaim(t, s, k, req, idemgate.Claimed)
			if err := s.Complete(testCtx(t), k, req.Token, sample(), d); err != nil {
				t.Errorf("%s: Complete with retention %v: %v", name, d, err)
			}
			time.Sleep(5 * time.Millisecond)
			if res, err := s.Claim(testCtx(t), k, request(time.Hour)); err != nil || res.Status != idemgate.Finished {
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

// TestAtomicHugeLeases: an Atomic route with a lease of math.MaxInt64 or
// 30 days, whose handler pauses between its two statements, commits both
// with its answer. The transaction's idle limit is twice the lease:
// computed naively it overflows to a negative duration (and became 1ms,
// ending the transaction at the first pause), or, from a lease of about
// 12.4 days on, exceeds what PostgreSQL accepts for
// idle_in_transaction_session_timeout (INT_MAX ms), failing BEGIN's SET
// LOCAL.
func TestAtomicHugeLeases(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	for _, lease := range []time.Duration{math.MaxInt64, math.MaxInt64 - 1, 30 * 24 * time.Hour, 13 * 24 * time.Hour, 12 * 24 * time.Hour} {
		k := strings.ReplaceAll("huge-lease-"+lease.String(), ".", "-")
		e := atomicRoute(t, s, func(c echo.Context) error {
			ctx, tx := c.Request().Context(), pgrecords.Tx(c)
			if err := ledgerInsert(ctx, tx, k, "a"); err != nil {
				return err
			}
			time.Sleep(50 * time.Millisecond)
			if err := ledgerInsert(ctx, tx, k, "b"); err != nil {
				return err
			}
			return c.String(http.StatusCreated, "ok")
		}, func(c *middleware.Config) { c.Lease = lease })
		if rec := atomicSend(e, k); rec.Code != http.StatusCreated {
			t.Errorf("lease %v: request = %d %s, want 201", lease, rec.Code, rec.Body)
		}
		if got := ledgerNodes(t, pool, k); got != "a,b" {
			t.Errorf("lease %v: committed %q, want %q", lease, got, "a,b")
		}
	}
}

// TestAtomicServerIdleLimitKept: the server's own
// idle_in_transaction_session_timeout (here the database's, 300ms) is
// lower than twice a route's lease (an hour): BEGIN's SET LOCAL must not
// lift it. A handler idle in its transaction past the server's limit
// loses the transaction (not a 2xx; nothing committed; the retry runs),
// as it would on any other transaction of the pool.
func TestAtomicServerIdleLimitKept(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	admin := newPool(t, dsn)
	if _, err := admin.Exec(testCtx(t), ledgerDDL+`; DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET idle_in_transaction_session_timeout = ''300ms''', current_database()); END $$`); err != nil {
		t.Fatal(err)
	}
	pool := newPool(t, dsn) // its sessions start with the database's setting
	s := newStore(t, pool)
	idle := true
	e := atomicRoute(t, s, func(c echo.Context) error {
		ctx, tx := c.Request().Context(), pgrecords.Tx(c)
		if err := ledgerInsert(ctx, tx, "idle", "a"); err != nil {
			return err
		}
		if idle {
			time.Sleep(1500 * time.Millisecond) // idle in the transaction, 5 times the server's limit
		}
		return c.String(http.StatusCreated, "ok")
	}, func(c *middleware.Config) { c.Lease = time.Hour })
	if rec := atomicSend(e, "idle"); rec.Code/100 == 2 {
		t.Errorf("a handler idle in its transaction past the server's limit got %d %q to its client", rec.Code, rec.Body)
	}
	if got := ledgerRows(t, pool, "idle"); got != 0 {
		t.Errorf("ledger rows = %d, want 0", got)
	}
	idle = false
	if rec := atomicSend(e, "idle"); rec.Code != http.StatusCreated || rec.Header().Get("Idempotent-Replayed") != "" {
		t.Errorf("retry = %d replayed=%q, want a run", rec.Code, rec.Header().Get("Idempotent-Replayed"))
	}
}
