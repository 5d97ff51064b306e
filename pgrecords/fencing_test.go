package pgrecords_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/internal/wait"
	"github.com/idemgate/idemgate/pgrecords"
)

// TestFencingSequences: stale and out-of-order calls of a token
// whose claim expired, was reclaimed, released or finished change
// nothing and answer ErrLeaseLost (or nil for a resent Complete).
func TestFencingSequences(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	s, s2 := newStore(t, newPool(t, dsn)), newStore(t, newPool(t, dsn))
	lost := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, idemgate.ErrLeaseLost) {
			t.Errorf("%s = %v, want ErrLeaseLost", what, err)
		}
	}

	// Expired and reclaimed: the stale token can do nothing; the new holder
	// is untouched.
	k := key()
	stale := request(50 * time.Millisecond)
	mustClaim(t, s, k, stale, idemgate.Claimed)
	time.Sleep(150 * time.Millisecond)
	lost("Extend of an expired claim", s.Extend(testCtx(t), k, stale.Token, time.Hour))
	fresh := request(time.Hour)
	mustClaim(t, s2, k, fresh, idemgate.Claimed)
	lost("stale Extend", s.Extend(testCtx(t), k, stale.Token, time.Hour))
	lost("stale Complete", s.Complete(testCtx(t), k, stale.Token, sample(), time.Hour))
	lost("stale Release", s.Release(testCtx(t), k, stale.Token))
	resent := stale
	resent.Lease = time.Hour
	mustClaim(t, s, k, resent, idemgate.Running) // the stale token's resent claim finds the new holder
	if err := s2.Complete(testCtx(t), k, fresh.Token, sample(), time.Hour); err != nil {
		t.Fatalf("fresh Complete: %v", err)
	}
	// Resent Complete (a different response even) succeeds and changes nothing.
	other := sample()
	other.Body = []byte("other")
	if err := s.Complete(testCtx(t), k, fresh.Token, other, time.Hour); err != nil {
		t.Errorf("resent Complete = %v, want nil", err)
	}
	lost("Extend after Complete", s.Extend(testCtx(t), k, fresh.Token, time.Hour))
	lost("Release after Complete", s.Release(testCtx(t), k, fresh.Token))
	lost("stale Complete after Complete", s.Complete(testCtx(t), k, stale.Token, other, time.Hour))
	r := fresh
	r.Token = token()
	if got := mustClaim(t, s, k, r, idemgate.Finished).Response; !bytes.Equal(got.Body, sample().Body) {
		t.Errorf("replay %q, want the first Complete's body", got.Body)
	}
	// The finishing token's resent claim replays too.
	mustClaim(t, s, k, fresh, idemgate.Finished)

	// Release, then everything of that token is lost; its resent claim
	// claims afresh (the record is gone).
	k = key()
	req := request(time.Hour)
	mustClaim(t, s, k, req, idemgate.Claimed)
	if err := s.Release(testCtx(t), k, req.Token); err != nil {
		t.Fatal(err)
	}
	lost("Complete after Release", s.Complete(testCtx(t), k, req.Token, sample(), time.Hour))
	lost("Extend after Release", s.Extend(testCtx(t), k, req.Token, time.Hour))
	lost("Release after Release", s.Release(testCtx(t), k, req.Token))

	// A finished record past its retention: the finishing token's
	// resent Complete is lost (the record is expired), and the key claims.
	k = key()
	req = request(time.Hour)
	mustClaim(t, s, k, req, idemgate.Claimed)
	if err := s.Complete(testCtx(t), k, req.Token, sample(), 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond)
	lost("resent Complete past retention", s.Complete(testCtx(t), k, req.Token, sample(), time.Hour))
	r = req
	r.Token = token()
	mustClaim(t, s, k, r, idemgate.Claimed)
}

// lockExpired claims k with a lease that runs out at once and has another
// session hold the expired row's lock (as a Sweep batch or a concurrent
// reclaim does while it runs); unlock rolls that session back.
func lockExpired(t *testing.T, pool *pgxpool.Pool, s *pgrecords.Store, k string) (unlock func()) {
	t.Helper()
	mustClaim(t, s, k, request(time.Microsecond), idemgate.Claimed)
	time.Sleep(5 * time.Millisecond)
	locker, err := pool.Begin(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = locker.Rollback(context.Background()) })
	if _, err := locker.Exec(testCtx(t), `SELECT 1 FROM idemgate_records WHERE key = $1 FOR UPDATE`, k); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		if err := locker.Rollback(testCtx(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// claimsRunning counts the sessions that run the claim statement.
func claimsRunning(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(testCtx(t), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND state = 'active' AND query LIKE '%idemgate_records_claim(%' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitClaims waits until claimsRunning is want.
func waitClaims(t *testing.T, pool *pgxpool.Pool, want int) {
	t.Helper()
	wait.For(t, 30*time.Second, fmt.Sprintf("%d claims running on the server", want), func() bool { return claimsRunning(t, pool) == want })
}

// TestAbandonedClaimOnLock: a claim whose context ends (or whose
// statement_timeout fires) while it waits on a row lock returns an error,
// and the server abandons the statement too (on a pool that sends a cancel
// request when a context ends mid-query): once the lock frees, nothing was
// claimed, so the middleware's release after a failed claim and the
// client's retry find the key free, not held for a lease by nobody.
func TestAbandonedClaimOnLock(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	pool := newPool(t, dsn)
	s := newStore(t, pool)
	// pgx's default on a context that ends mid-query only closes the
	// connection, and a backend waiting on a lock does not notice until
	// the lock frees; a pool whose connections send a cancel request when
	// a context ends (as an application sets it) is abandoned at once.
	cancels, err := pgrecords.New(testCtx(t), poolWith(t, dsn, func(c *pgxpool.Config) {
		c.ConnConfig.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 10 * time.Second}
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	timeouts, err := pgrecords.New(testCtx(t), poolWith(t, dsn, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["statement_timeout"] = "200ms"
	}))
	if err != nil {
		t.Fatal(err)
	}
	// The context is cancelled once the claim waits on the lock; the
	// statement_timeout fires by itself (SQLSTATE 57014 proves that the
	// statement ran on the server), so the test does not look for it
	// waiting: on a loaded machine it may be over before a look.
	for name, c := range map[string]struct {
		s   *pgrecords.Store
		ctx func() (context.Context, context.CancelFunc)
	}{
		"context canceled":  {cancels, func() (context.Context, context.CancelFunc) { return context.WithCancel(testCtx(t)) }},
		"statement_timeout": {timeouts, func() (context.Context, context.CancelFunc) { return testCtx(t), func() {} }},
	} {
		k := key()
		unlock := lockExpired(t, pool, s, k)
		req := request(time.Hour)
		ctx, cancel := c.ctx()
		type answer struct {
			res idemgate.ClaimResult
			err error
		}
		done := make(chan answer, 1)
		go func() {
			res, err := c.s.Claim(ctx, k, req)
			done <- answer{res, err}
		}()
		if name == "context canceled" {
			waitClaims(t, pool, 1) // the claim waits on the lock
		}
		cancel()
		a := <-done
		res, err := a.res, a.err
		if err == nil {
			t.Fatalf("%s: Claim blocked on a lock = %v, want an error", name, res.Status)
		}
		var pgErr *pgconn.PgError
		if name == "statement_timeout" && (!errors.As(err, &pgErr) || pgErr.Code != "57014") {
			t.Errorf("%s: Claim = %v, want SQLSTATE 57014", name, err)
		}
		waitClaims(t, pool, 0) // the server abandoned it
		unlock()
		if err := s.Release(testCtx(t), k, req.Token); !errors.Is(err, idemgate.ErrLeaseLost) {
			t.Errorf("%s: release of the abandoned claim = %v, want ErrLeaseLost (it never claimed)", name, err)
		}
		mustClaim(t, s, k, request(time.Hour), idemgate.Claimed)
	}
}

// TestConcurrentFencedCalls: the holder's own calls racing each
// other (a resent Complete beside the first, Complete beside Release,
// Extend beside both), on a pool of one connection and a pool of many:
// Complete and Release never both succeed, a record that Complete
// finished holds exactly one of the responses sent, and a released
// record is gone.
func TestConcurrentFencedCalls(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	one := newStore(t, poolWith(t, dsn, func(c *pgxpool.Config) { c.MaxConns = 1 }))
	many := newStore(t, newPool(t, dsn))
	stores := []*pgrecords.Store{one, many}
	for round := range 30 {
		k := key()
		req := request(time.Hour)
		mustClaim(t, many, k, req, idemgate.Claimed)
		var (
			wg        sync.WaitGroup
			completed atomic.Int64
			released  atomic.Int64
		)
		for i := range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := stores[i%2]
				var err error
				switch i % 3 {
				case 0:
					resp := sample()
					resp.Body = []byte(fmt.Sprintf("body-%d", i))
					if err = s.Complete(testCtx(t), k, req.Token, resp, time.Hour); err == nil {
						completed.Add(1)
					}
				case 1:
					if round%2 == 1 {
						if err = s.Release(testCtx(t), k, req.Token); err == nil {
							released.Add(1)
						}
					}
				default:
					err = s.Extend(testCtx(t), k, req.Token, time.Hour)
				}
				if err != nil && !errors.Is(err, idemgate.ErrLeaseLost) {
					t.Errorf("round %d: %v", round, err)
				}
			}()
		}
		wg.Wait()
		if completed.Load() > 0 && released.Load() > 0 {
			t.Fatalf("round %d: %d completes and %d releases succeeded", round, completed.Load(), released.Load())
		}
		if released.Load() > 1 {
			t.Fatalf("round %d: %d releases succeeded", round, released.Load())
		}
		r := request(time.Hour)
		res := mustClaim(t, one, k, r, map[bool]idemgate.ClaimStatus{true: idemgate.Finished, false: idemgate.Claimed}[completed.Load() > 0])
		if res.Status == idemgate.Finished && !bytes.HasPrefix(res.Response.Body, []byte("body-")) {
			t.Fatalf("round %d: replay %q", round, res.Response.Body)
		}
	}
}

// TestConcurrentReclaimOfExpired: an expired claim is reclaimed by exactly
// one of many concurrent claims (its UPDATE … WHERE expired re-checks the row).
func TestConcurrentReclaimOfExpired(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	stores := []*pgrecords.Store{newStore(t, newPool(t, dsn)), newStore(t, newPool(t, dsn))}
	k := key()
	stale := request(100 * time.Millisecond)
	mustClaim(t, stores[0], k, stale, idemgate.Claimed)
	time.Sleep(300 * time.Millisecond)
	const n = 32
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners []idemgate.Token
		running int
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := request(time.Minute)
			res, err := stores[i%2].Claim(testCtx(t), k, r)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Errorf("Claim: %v", err)
			case res.Status == idemgate.Claimed:
				winners = append(winners, r.Token)
			case res.Status == idemgate.Running:
				running++
			default:
				t.Errorf("Claim = %v", res.Status)
			}
		}()
	}
	wg.Wait()
	if len(winners) != 1 || running != n-1 {
		t.Fatalf("%d winners, %d running; want 1 and %d", len(winners), running, n-1)
	}
	if err := stores[1].Complete(testCtx(t), k, stale.Token, sample(), time.Hour); !errors.Is(err, idemgate.ErrLeaseLost) {
		t.Errorf("stale Complete = %v, want ErrLeaseLost", err)
	}
	if err := stores[1].Complete(testCtx(t), k, winners[0], sample(), time.Hour); err != nil {
		t.Errorf("winner's Complete: %v", err)
	}
}
