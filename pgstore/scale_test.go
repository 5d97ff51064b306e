package pgstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// scaleCase is one queue the scale measurement builds: a backlog of kind
// image loaded with generate_series, then limits.
type scaleCase struct {
	name    string
	tasks   int // waiting tasks, due an hour ago
	tenants int // they are spread over, in turn
	capped  int // tenants (the first ones) running one attempt each, at MaxRunningPerTenant 1
	perTen  bool
	later   int // tasks of one other tenant scheduled for tomorrow
	full    bool
}

// TestScale measures the claim (p50/p99 of a claim of 16, in a
// transaction rolled back after, so the queue stays as built) and Submit
// (p50/p99 of a new task of a tenant with a backlog) on queues from small
// to large, and prints each as a ratio of the small queue's (with a
// per-tenant limit for the limited cases), measured in the same run, with
// each claim's buffers and rows (stable figures). The scheduled tasks are
// loaded as Submit stores them since v8 (no turn). Not part of
// make test: it takes minutes (PGSTORE_SCALE=quick, without the 1M
// backlog) to most of an hour. The scale command (tools/scale, make
// scale) times the same queues through a real worker; this test is for
// the claim's plan (buffers and rows), which only the package can
// EXPLAIN.
//
//	PGSTORE_SCALE=1 go test -count=1 -v -timeout 2h -run TestScale ./pgstore/
//	PGSTORE_SCALE=quick go test -count=1 -v -timeout 1h -run TestScale ./pgstore/
func TestScale(t *testing.T) {
	mode := os.Getenv("PGSTORE_SCALE")
	if mode == "" {
		t.Skip("set PGSTORE_SCALE=1 (or quick) to measure (with -v)")
	}
	samples := 300
	if mode == "quick" {
		samples = 100
	}
	cases := []scaleCase{
		{name: "small queue (baseline): 100 tasks, 10 tenants", tasks: 100, tenants: 10},
		{name: "backlog 10k, 100 tenants", tasks: 10_000, tenants: 100},
		{name: "backlog 100k, 100 tenants", tasks: 100_000, tenants: 100},
		{name: "backlog 1M, 100 tenants", tasks: 1_000_000, tenants: 100, full: true},
		{name: "backlog 100k, 1 tenant", tasks: 100_000, tenants: 1},
		{name: "backlog 100k, 10,000 tenants", tasks: 100_000, tenants: 10_000},
		{name: "small queue with a per-tenant limit (baseline of the limited claims)", tasks: 100, tenants: 10, perTen: true},
		{name: "1,000 tenants × 50, per-tenant limit, 0% capped", tasks: 50_000, tenants: 1000, perTen: true},
		{name: "1,000 tenants × 50, per-tenant limit, 50% capped", tasks: 50_000, tenants: 1000, perTen: true, capped: 500},
		{name: "1,000 tenants × 50, per-tenant limit, 100% capped", tasks: 50_000, tenants: 1000, perTen: true, capped: 1000},
		{name: "100 tasks of 10 tenants beside 100k scheduled", tasks: 100, tenants: 10, later: 100_000},
	}
	type result struct {
		claim50, claim99, submit50, submit99 time.Duration
		plan                                 planFigures
		load                                 string
	}
	base := map[bool]result{} // the small queues, without and with limits
	var out []string
	for i, c := range cases {
		if c.full && mode == "quick" {
			continue
		}
		s, _ := setup(t)
		buildScaleCase(t, s, c)
		kinds := []string{"image"}
		w := newWorker(t, s, WorkerConfig{Kinds: kinds, Handler: func(context.Context, Task) Outcome { return Outcome{} }})
		w.limited.Store(c.perTen)
		var r result
		r.plan = claimPlan(t, s, kinds, 16)
		r.claim50, r.claim99 = percentiles(timeClaims(t, s, w, samples))
		r.submit50, r.submit99 = percentiles(timeSubmits(t, s, i, samples))
		r.load = loadAvg()
		if c.tasks == 100 && c.later == 0 {
			base[c.perTen] = r
		}
		b := base[c.perTen]
		ratio := func(a, b time.Duration) string { return fmt.Sprintf("%.2f×", float64(a)/float64(b)) }
		line := fmt.Sprintf("| %s | %.2f / %.2f ms | %s / %s | %d buffers, %d rows | %.2f / %.2f ms | %s / %s | %s |",
			c.name, ms(r.claim50), ms(r.claim99), ratio(r.claim50, b.claim50), ratio(r.claim99, b.claim99),
			r.plan.Buffers, r.plan.Rows, ms(r.submit50), ms(r.submit99),
			ratio(r.submit50, b.submit50), ratio(r.submit99, b.submit99), r.load)
		t.Log(line)
		out = append(out, line)
	}
	t.Logf("\n| queue | claim p50 / p99 | ratio | claim plan | Submit p50 / p99 | ratio | load |\n|---|---|---|---|---|---|---|\n%s",
		strings.Join(out, "\n"))
}

// buildScaleCase loads c's queue into s's database.
func buildScaleCase(t *testing.T, s *Store, c scaleCase) {
	t.Helper()
	ctx := context.Background()
	stmts := []string{fmt.Sprintf(`INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after, turn)
		SELECT 'tenant-' || g %% %[2]d, 'o', 'image', 'gpu', 'main', 'w-' || g, 'f', now() - interval '1 hour', g / %[2]d
		FROM generate_series(0, %[1]d - 1) g`, c.tasks, c.tenants)}
	if c.capped > 0 {
		stmts = append(stmts, fmt.Sprintf(`INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, state, attempt, tries,
			lease_until, locked_by, turn)
		SELECT 'tenant-' || g, 'o', 'image', 'gpu', 'main', 'r-' || g, 'f', 'running', 1, 1,
			now() + interval '1 hour', 'elsewhere', 0
		FROM generate_series(0, %d - 1) g`, c.capped))
	}
	if c.later > 0 {
		stmts = append(stmts, fmt.Sprintf(`INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after, turn)
		SELECT 'planner', 'o', 'image', 'gpu', 'main', 's-' || g, 'f', now() + interval '1 day', g
		FROM generate_series(0, %d - 1) g`, c.later))
	}
	stmts = append(stmts, "VACUUM ANALYZE idemgate_tasks")
	for _, sql := range stmts {
		if _, err := s.pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	if c.perTen {
		if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunningPerTenant: 1}); err != nil {
			t.Fatal(err)
		}
	}
}

// timeClaims times n claims of 16 by w, each in a transaction rolled
// back after (the worker's lock statement first, as it sends it before a
// limited claim), so every claim sees the queue as built.
func timeClaims(t *testing.T, s *Store, w *Worker, n int) []time.Duration {
	t.Helper()
	ctx := context.Background()
	sql, args := w.claimStatement(16)
	var took []time.Duration
	for range n {
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			start := time.Now()
			if _, err := tx.Exec(ctx, sqlLockLimitedKinds, pgx.NamedArgs{"kinds": w.cfg.Kinds}); err != nil {
				return err
			}
			rows, _ := tx.Query(ctx, sql, args)
			if _, err := pgx.CollectRows(rows, pgx.RowToStructByName[Task]); err != nil {
				return err
			}
			took = append(took, time.Since(start))
			return errRollback
		})
		if !errors.Is(err, errRollback) {
			t.Fatal(err)
		}
	}
	return took
}

// timeSubmits times n Submits of new tasks of a tenant with a backlog.
func timeSubmits(t *testing.T, s *Store, run, n int) []time.Duration {
	t.Helper()
	var took []time.Duration
	for i := range n {
		nt := tenantTask("tenant-0", fmt.Sprintf("probe-%d-%d", run, i))
		start := time.Now()
		if _, err := s.Submit(context.Background(), nt); err != nil {
			t.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	return took
}

func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	slices.Sort(d)
	return d[len(d)/2], d[len(d)*99/100]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// loadAvg is the machine's one-minute load average, for the record.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}
