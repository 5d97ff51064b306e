package pgrecords_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/pgrecords"
)

// TestSweepRacesClaims: many goroutines on two pools claim,
// complete and release short-lived records while others sweep: every
// claim answers (no "did not settle"), every key has at most one holder at
// a time, and a completed record is never swept while live.
func TestSweepRacesClaims(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	stores := []*pgrecords.Store{newStore(t, newPool(t, dsn)), newStore(t, newPool(t, dsn))}
	keys := []string{key(), key(), key(), key()}
	ctx, cancel := context.WithTimeout(testCtx(t), 3*time.Second)
	defer cancel()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		holders = map[string]idemgate.Token{}
	)
	for g := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[g%2]
			for i := 0; ctx.Err() == nil; i++ {
				k := keys[(g+i)%len(keys)]
				req := request(time.Duration(1+i%5) * time.Millisecond)
				res, err := s.Claim(ctx, k, req)
				if ctx.Err() != nil {
					return
				}
				if err != nil {
					t.Errorf("Claim: %v", err)
					return
				}
				if res.Status != idemgate.Claimed {
					continue
				}
				mu.Lock()
				holders[k] = req.Token
				mu.Unlock()
				switch i % 3 {
				case 0:
					err = s.Complete(ctx, k, req.Token, sample(), time.Duration(1+i%3)*time.Millisecond)
				case 1:
					err = s.Release(ctx, k, req.Token)
				default:
					err = s.Extend(ctx, k, req.Token, time.Millisecond)
				}
				if err != nil && !errors.Is(err, idemgate.ErrLeaseLost) && ctx.Err() == nil {
					t.Errorf("fenced call: %v", err)
				}
			}
		}()
	}
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if _, err := stores[g%2].Sweep(ctx); err != nil && ctx.Err() == nil {
					t.Errorf("Sweep: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	// A long-lived finished record survives sweeps.
	k := key()
	req := request(time.Hour)
	mustClaim(t, stores[0], k, req, idemgate.Claimed)
	if err := stores[0].Complete(testCtx(t), k, req.Token, sample(), time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, s := range stores {
		if _, err := s.Sweep(testCtx(t)); err != nil {
			t.Fatal(err)
		}
	}
	r := req
	r.Token = token()
	mustClaim(t, stores[1], k, r, idemgate.Finished)
}

// TestSweep: Sweep deletes expired claims and finished records past their
// retention, in batches, from many goroutines on two pools at once, and
// leaves live records alone; on a cancelled context it deletes nothing.
func TestSweep(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	pool := newPool(t, dsn)
	s := newStore(t, pool)
	s2 := newStore(t, newPool(t, dsn))
	// 2500 expired rows, written directly; a few live records through the store.
	if _, err := pool.Exec(testCtx(t), `INSERT INTO idemgate_records (key, token, finished, expires_at, ident)
		SELECT 'expired-' || i, gen_random_uuid(), i % 2 = 0, now() - interval '1 second', '\x00'
		FROM generate_series(1, 2500) AS i`); err != nil {
		t.Fatal(err)
	}
	live := []string{key(), key()}
	running := request(time.Hour)
	mustClaim(t, s, live[0], running, idemgate.Claimed)
	done := request(time.Hour)
	mustClaim(t, s, live[1], done, idemgate.Claimed)
	if err := s.Complete(testCtx(t), live[1], done.Token, sample(), time.Hour); err != nil {
		t.Fatal(err)
	}

	// A cancelled context deletes nothing: the sweeps below find all 2500.
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Sweep(canceled); err == nil {
		t.Errorf("Sweep with a cancelled context succeeded")
	}

	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int64
	)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := []*pgrecords.Store{s, s2}[i%2].Sweep(testCtx(t))
			if err != nil {
				t.Errorf("Sweep: %v", err)
			}
			mu.Lock()
			total += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	if total != 2500 {
		t.Errorf("sweeps deleted %d, want 2500", total)
	}
	var left int
	if err := pool.QueryRow(testCtx(t), `SELECT count(*) FROM idemgate_records`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 2 {
		t.Errorf("%d records left, want the 2 live ones", left)
	}
	other := running
	other.Token = token()
	mustClaim(t, s, live[0], other, idemgate.Running)
	other.Token = token()
	mustClaim(t, s, live[1], other, idemgate.Finished)
	if n, err := s.Sweep(testCtx(t)); err != nil || n != 0 {
		t.Errorf("Sweep of a swept table = %d, %v; want 0", n, err)
	}
}
