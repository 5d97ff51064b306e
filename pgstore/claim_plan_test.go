package pgstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// claimBacklog stores n due tasks of kind, of 100 tenants, with turns as
// Submit gives them, and analyzes the table.
func claimBacklog(t testing.TB, s *Store, kind string, n int) {
	t.Helper()
	if _, err := s.pool.Exec(context.Background(), `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after, turn)
		SELECT 'tenant-' || (g % 100), 'o', $2, 'gpu', 'main', 'backlog-' || g, 'f', now() - interval '1 hour', g / 100
		FROM generate_series(1, $1::int) g`, n, kind); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(context.Background(), "VACUUM ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
}

// A worker's claim is planned once per connection, not at every claim.
// Its LIMIT is a parameter, which a generic plan estimates at a tenth of
// the rows: beside a backlog the generic plan looked far costlier than a
// custom one, so Postgres planned every claim again (custom_plans grew
// by one a claim; 2–3 ms a claim at 100k, half its latency).
func TestClaimIsPlannedOnce(t *testing.T) {
	t.Parallel()
	for _, limited := range []bool{false, true} {
		for _, shape := range claimShapes[:2] {
			t.Run(fmt.Sprintf("%s/limited=%v", shape.name, limited), func(t *testing.T) {
				t.Parallel()
				// One session: its prepared statements are the claims'.
				s := newTestDB(t).storeWith(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
				pool := s.pool
				ctx := context.Background()
				if limited {
					if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunning: 1000}); err != nil {
						t.Fatal(err)
					}
				}
				claimBacklog(t, s, "image", 20000)
				w := newWorker(t, s, WorkerConfig{Kinds: shape.kinds, Lease: time.Hour,
					Handler: func(context.Context, Task) Outcome { return Outcome{} }})
				w.limited.Store(limited)
				const claims = 8
				taken := 0
				for range claims {
					sql, args := w.claimStatement(4)
					got, err := w.runClaim(ctx, sql, args)
					if err != nil {
						t.Fatal(err)
					}
					taken += len(got)
				}
				if taken != 4*claims {
					t.Fatalf("%d claims took %d tasks; want %d", claims, taken, 4*claims)
				}
				var custom, generic int
				if err := pool.QueryRow(ctx, `SELECT coalesce(sum(custom_plans), 0), coalesce(sum(generic_plans), 0)
					FROM pg_prepared_statements WHERE statement LIKE '%FOR UPDATE SKIP LOCKED%'`).Scan(&custom, &generic); err != nil {
					t.Fatal(err)
				}
				if custom != 0 || generic < claims {
					t.Fatalf("%d claims were planned %d times (custom plans) and ran a generic plan %d times; want 0 and %d",
						claims, custom, generic, claims)
				}
			})
		}
	}
}

// The generic plan of every claim shape, with and without limits, reads
// the claim index in order under the limit, as the custom plan does: no
// sequential scan of the tasks, and a few rows read for a claim of 16
// beside a backlog of 20k.
func TestClaimGenericPlanReadsTheIndex(t *testing.T) {
	t.Parallel()
	for _, limits := range []struct {
		name string
		kl   *KindLimits
	}{{"no limits", nil}, {"MaxRunning", &KindLimits{MaxRunning: 1000}}, {"MaxRunningPerTenant", &KindLimits{MaxRunningPerTenant: 5}}} {
		for _, shape := range claimShapes {
			t.Run(shape.name+"/"+limits.name, func(t *testing.T) {
				t.Parallel()
				s, _ := setup(t)
				ctx := context.Background()
				claimBacklog(t, s, shape.kind, 20000)
				if limits.kl != nil {
					if err := s.SetKindLimits(ctx, shape.kind, *limits.kl); err != nil {
						t.Fatal(err)
					}
				}
				w := newWorker(t, s, WorkerConfig{Kinds: shape.kinds, Handler: func(context.Context, Task) Outcome { return Outcome{} }})
				w.limited.Store(limits.kl != nil)
				sql, args := w.claimStatement(16)
				err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
					if limits.kl != nil {
						if _, err := tx.Exec(ctx, sqlLockLimitedKinds, pgx.NamedArgs{"kinds": shape.kinds}); err != nil {
							return err
						}
					} else if _, err := tx.Exec(ctx, sqlClaimSettings); err != nil {
						return err
					}
					var mode string
					if err := tx.QueryRow(ctx, "SHOW plan_cache_mode").Scan(&mode); err != nil {
						return err
					}
					if mode != "force_generic_plan" {
						t.Errorf("plan_cache_mode %q in the claim's transaction; want force_generic_plan", mode)
					}
					// Postgres 15 keeps the counts of earlier transactions of
					// the session in pg_stat_xact_user_tables until it flushes
					// them (at most once a second): only the claim's share counts.
					counts := func() (seq, fetched int64, err error) {
						err = tx.QueryRow(ctx, `SELECT seq_scan, coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables
							WHERE relid = 'idemgate_tasks'::regclass`).Scan(&seq, &fetched)
						return seq, fetched, err
					}
					seq0, fetched0, err := counts()
					if err != nil {
						return err
					}
					rows, _ := tx.Query(ctx, sql, args)
					got, err := pgx.CollectRows(rows, pgx.RowToStructByName[Task])
					if err != nil {
						return err
					}
					if len(got) != 16 {
						t.Errorf("the claim took %d tasks; want 16", len(got))
					}
					seq, fetched, err := counts()
					if err != nil {
						return err
					}
					seq, fetched = seq-seq0, fetched-fetched0
					t.Logf("generic plan: %d sequential scans, %d rows fetched by index", seq, fetched)
					if seq != 0 || fetched > 2000 {
						t.Errorf("the claim's generic plan ran %d sequential scans and fetched %d rows by index; want none and a few",
							seq, fetched)
					}
					return errRollback
				})
				if err != errRollback {
					t.Fatal(err)
				}
			})
		}
	}
}

// A claim's generic plan is made at a connection's first claim and kept
// until the table's statistics change: a plan made on a small queue,
// before the table was ever analyzed, still serves the claims once a
// backlog has come (faster than autovacuum's first ANALYZE). Every shape
// of claim then reads what it read on the small queue, not the backlog.
// On the small queue's statistics the planner took the table for a few
// pages: the per-tenant claim's lock of its candidates by primary key
// became a sequential scan (100,601 rows read for a claim of 1 beside
// 100k tasks), and before its state was spelled so that no partial
// index applies (stillWaitingT), a bitmap of the whole claim index
// (100,502 rows). Claims run with enable_seqscan off: every read of a
// claim is meant to be an index read.
func TestClaimPlannedOnASmallQueueReadsNoBacklogLater(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		kinds  []string
		limits *KindLimits
	}{
		{name: "any kind", kinds: nil},
		{name: "any kind, MaxRunningPerTenant", kinds: nil, limits: &KindLimits{MaxRunningPerTenant: 2}},
		{name: "named kind", kinds: []string{"image"}},
		{name: "named kind, MaxRunningPerTenant", kinds: []string{"image"}, limits: &KindLimits{MaxRunningPerTenant: 2}},
		{name: "named kind, MaxRunning", kinds: []string{"image"}, limits: &KindLimits{MaxRunning: 100_000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, _ := setup(t)
			ctx := context.Background()
			if _, err := s.pool.Exec(ctx, `ALTER TABLE idemgate_tasks SET (autovacuum_enabled = false)`); err != nil {
				t.Fatal(err)
			}
			if tt.limits != nil {
				if err := s.SetKindLimits(ctx, "image", *tt.limits); err != nil {
					t.Fatal(err)
				}
			}
			submitBacklog(t, s, "small", 500, "a", "b", "c", "d", "e", "f", "g", "h", "i", "j")
			before := map[int][2]int64{}
			for _, n := range []int{1, 16} {
				_, f, sr := claimReads(t, s, tt.kinds, n)
				before[n] = [2]int64{f, sr}
			}
			tenants := make([]string, 500)
			for i := range tenants {
				tenants[i] = fmt.Sprint("t-", i)
			}
			submitBacklog(t, s, "big", 20_000, tenants...)
			for _, n := range []int{1, 16} {
				c, f, sr := claimReads(t, s, tt.kinds, n)
				b := before[n]
				t.Logf("claim of %d: %d taken; rows read by index %d, sequentially %d (on the small queue: %d, %d)", n, c, f, sr, b[0], b[1])
				if c != n {
					t.Errorf("the claim of %d took %d tasks", n, c)
				}
				if f > 2*b[0]+64 || sr > 2*b[1]+64 {
					t.Errorf("the claim of %d read %d rows by index and %d sequentially beside a backlog of 20k, %d and %d on the small queue",
						n, f, sr, b[0], b[1])
				}
			}
		})
	}
}
