package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/jackc/pgx/v5"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// pausedBacklog stores a paused kind's backlog: tasks waiting tasks of
// kind image over tenants tenants, in turn, and pauses image.
func pausedBacklog(t testing.TB, s *Store, tasks, tenants int) {
	t.Helper()
	ctx := context.Background()
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, turn)
		SELECT 'tenant-' || g % $2, 'o', 'image', 'gpu', 'main', 'p-' || g, 'f', g / $2
		FROM generate_series(0, $1 - 1) g
		ON CONFLICT DO NOTHING`, tasks, tenants); err != nil {
		t.Fatal(err)
	}
	if err := s.SetKindLimits(ctx, "image", KindLimits{Paused: true}); err != nil {
		t.Fatal(err)
	}
}

// drainAnyKind submits n tasks of kind audio (10 tenants) and runs a
// worker of every kind (16 slots) until
// it has run them all, and returns how long that took from the worker's
// start. Each handler takes 2 ms, so that slots free one by one and the
// worker claims a few tasks at a time, as it does beside real handlers.
func drainAnyKind(t *testing.T, s *Store, round, n int) time.Duration {
	t.Helper()
	batch := make([]NewTask, n)
	for i := range batch {
		batch[i] = tenantTask(fmt.Sprintf("a-%d", i%10), fmt.Sprintf("audio-%d-%d", round, i))
		batch[i].Kind = "audio"
	}
	if _, err := s.SubmitMany(context.Background(), batch); err != nil {
		t.Fatal(err)
	}
	var ran, claimedN, claimNS atomic.Int64
	done := make(chan struct{})
	w := newWorker(t, s, WorkerConfig{Concurrency: 16, OnEvent: func(e WorkerEvent) {
		if e.Type == WorkerClaimed {
			claimedN.Add(1)
			claimNS.Add(int64(e.Latency))
		}
	}, Handler: func(_ context.Context, task Task) Outcome {
		time.Sleep(2 * time.Millisecond) // handlers end at different times: claims of a few tasks, as in a service
		if ran.Add(1) == int64(n) {
			close(done)
		}
		return Succeeded(json.RawMessage(`1`))
	}})
	begin := time.Now()
	stop := runWorker(t, w)
	select {
	case <-done:
	case <-time.After(5 * patience):
		t.Fatalf("round %d: %d of %d tasks ran", round, ran.Load(), n)
	}
	took := time.Since(begin)
	stop()
	t.Logf("%d claims, %d attempts, mean claim latency per attempt %v", w.claims.Load(), claimedN.Load(), time.Duration(claimNS.Load()/max(1, claimedN.Load())))
	return took
}

// A worker of every kind drains another kind's 1,000 tasks beside a
// paused kind's 100,000 waiting tasks over 500 tenants, against the same
// drain on a queue without them, rounds alternating, in one run: the
// ratio of the medians (target <= 2x; docs/queue.md, "Pause"). Each
// drain logs its claims and their mean latency.
//
//	PGSTORE_MEASURE=1 go test -count=1 -v -run TestMeasureAnyKindWorkerBesidePausedBacklog ./pgstore/
func TestMeasureAnyKindWorkerBesidePausedBacklog(t *testing.T) {
	measuring(t)
	const rounds, n = 5, 1000
	base, _ := setup(t)
	paused, _ := setup(t)
	// Neither table is analyzed during the run (as a new deployment's,
	// until autovacuum's first ANALYZE): the statistics a claim's generic
	// plan is made from are the empty table's.
	for _, s := range []*Store{base, paused} {
		if _, err := s.pool.Exec(context.Background(), `ALTER TABLE idemgate_tasks SET (autovacuum_enabled = false)`); err != nil {
			t.Fatal(err)
		}
	}
	pausedBacklog(t, paused, 100_000, 500)
	var tookBase, tookPaused []time.Duration
	for r := range rounds {
		tookBase = append(tookBase, drainAnyKind(t, base, r, n))
		tookPaused = append(tookPaused, drainAnyKind(t, paused, r, n))
		t.Logf("round %d: %v on the small queue, %v beside the paused backlog (load %s)",
			r, tookBase[r].Round(time.Millisecond), tookPaused[r].Round(time.Millisecond), loadAvg())
	}
	slices.Sort(tookBase)
	slices.Sort(tookPaused)
	mb, mp := tookBase[rounds/2], tookPaused[rounds/2]
	t.Logf("a worker of every kind ran %d tasks of another kind in %v (median of %d) beside a paused kind's 100k tasks over 500 tenants, %v without: %.2fx (target <= 2x)",
		n, mp.Round(time.Millisecond), rounds, mb.Round(time.Millisecond), float64(mp)/float64(mb))
}

// claimReads runs the claim of up to n tasks of a worker of kinds (every
// kind: nil) as the worker sends it (the limited claim after its lock
// statement while some kind has limits, else the free claim after its
// settings: so on the generic plan), in a transaction it rolls back, and returns the claimed tasks
// and the rows the claim read from idemgate_tasks, by index and
// sequentially (pg_stat_xact_user_tables).
func claimReads(t testing.TB, s *Store, kinds []string, n int) (claimed int, fetched, seqRead int64) {
	t.Helper()
	ctx := context.Background()
	w := newWorker(t, s, WorkerConfig{Kinds: kinds, Handler: func(context.Context, Task) Outcome { return Outcome{} }})
	var limited bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM idemgate_kind_limits l WHERE `+hasLimits+`)`).Scan(&limited); err != nil {
		t.Fatal(err)
	}
	w.limited.Store(limited)
	sql, args := w.claimStatement(n)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		settings := sqlClaimSettings
		if limited {
			settings = sqlLockLimitedKinds
		}
		if _, err := tx.Exec(ctx, settings, pgx.NamedArgs{"kinds": kinds}); err != nil {
			return err
		}
		counts := func() (f, sr int64, err error) {
			err = tx.QueryRow(ctx, `SELECT coalesce(idx_tup_fetch, 0), coalesce(seq_tup_read, 0) FROM pg_stat_xact_user_tables
				WHERE relid = 'idemgate_tasks'::regclass`).Scan(&f, &sr)
			return f, sr, err
		}
		f0, s0, err := counts()
		if err != nil {
			return err
		}
		rows, _ := tx.Query(ctx, sql, args)
		got, err := pgx.CollectRows(rows, pgx.RowToStructByName[Task])
		if err != nil {
			return err
		}
		for _, task := range got {
			if task.State != stateHeld {
				claimed++
			}
		}
		f1, s1, err := counts()
		fetched, seqRead = f1-f0, s1-s0
		if err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	return claimed, fetched, seqRead
}

// A worker of every kind does not read a paused kind's backlog: the rows
// its claim reads (by index and sequentially) beside a paused kind's
// 100,000 waiting tasks over 500 tenants are those it read without them,
// whether the table's statistics are those of the small queue (the
// backlog came faster than autovacuum's ANALYZE, and every claim is
// planned generic from them) or fresh. Before, the claim's lock of its
// candidates by primary key also satisfied the claim index's predicate,
// and on the small queue's statistics the generic plan ANDed a bitmap of
// the whole claim index with the primary key's: 101,005 rows read for a
// claim of 1, at every claim.
func TestAnyKindClaimBesidePausedBacklogReadsNoBacklog(t *testing.T) {
	t.Parallel()
	for _, stats := range []string{"never analyzed", "analyzed when most tasks had finished", "fresh statistics"} {
		t.Run(stats, func(t *testing.T) {
			t.Parallel()
			s, _ := setup(t)
			ctx := context.Background()
			if _, err := s.pool.Exec(ctx, `ALTER TABLE idemgate_tasks SET (autovacuum_enabled = false)`); err != nil {
				t.Fatal(err)
			}
			if stats != "never analyzed" {
				// A queue's table at rest: most of its tasks finished.
				if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
					(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, state, finished_at)
					SELECT 'done-' || g % 50, 'o', 'audio', 'gpu', 'main', 'done-' || g, 'f', 'succeeded', now()
					FROM generate_series(1, 20000) g`); err != nil {
					t.Fatal(err)
				}
			}
			batch := make([]NewTask, 1000)
			for i := range batch {
				batch[i] = tenantTask(fmt.Sprintf("a-%d", i%10), fmt.Sprintf("audio-%d", i))
				batch[i].Kind = "audio"
			}
			if _, err := s.SubmitMany(ctx, batch); err != nil {
				t.Fatal(err)
			}
			// A paused kind's few tasks, so that the claim's shape (two
			// kinds waiting, one of them paused) is the same before and
			// after the backlog.
			pausedBacklog(t, s, 500, 500)
			if stats != "never analyzed" {
				if _, err := s.pool.Exec(ctx, "ANALYZE idemgate_tasks"); err != nil {
					t.Fatal(err)
				}
			}
			type reads struct{ claimed, fetched, seq int64 }
			before := map[int]reads{}
			for _, n := range []int{1, 16} {
				c, f, sr := claimReads(t, s, nil, n)
				before[n] = reads{int64(c), f, sr}
			}
			pausedBacklog(t, s, 100_000, 500)
			if stats == "fresh statistics" {
				if _, err := s.pool.Exec(ctx, "ANALYZE idemgate_tasks"); err != nil {
					t.Fatal(err)
				}
			}
			for _, n := range []int{1, 16} {
				c, f, sr := claimReads(t, s, nil, n)
				b := before[n]
				t.Logf("claim of %d: %d taken; rows read by index %d, sequentially %d (beside 500 paused tasks: %d, %d)",
					n, c, f, sr, b.fetched, b.seq)
				if int64(c) != b.claimed || c != n {
					t.Errorf("the claim of %d took %d tasks beside the paused backlog, %d beside 500 paused tasks", n, c, b.claimed)
				}
				if f > 2*b.fetched+16 || sr > 2*b.seq+16 {
					t.Errorf("the claim of %d read %d rows by index and %d sequentially beside a paused kind's 100k tasks, %d and %d beside 500",
						n, f, sr, b.fetched, b.seq)
				}
			}
		})
	}
}
