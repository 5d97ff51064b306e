package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/internal/wait"
)

// measuring skips t unless PGSTORE_MEASURE is set: the measurements print
// figures (run with -v) and assert nothing about time.
func measuring(t *testing.T) {
	t.Helper()
	if os.Getenv("PGSTORE_MEASURE") == "" {
		t.Skip("set PGSTORE_MEASURE=1 to measure (with -v)")
	}
}

// explain prints EXPLAIN (ANALYZE, BUFFERS) of sql with args, in a
// transaction rolled back after, so a claim claims nothing for good. The
// lock statement a worker sends before a limited claim runs first (it
// also turns JIT off, as for the claim): without the locks, a limited
// kind has no room and the claim reads none of it.
func explain(t *testing.T, s *Store, title, sql string, args pgx.NamedArgs) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, sqlLockLimitedKinds, pgx.NamedArgs{"kinds": args["kinds"]}); err != nil {
		t.Fatal(err)
	}
	rows, _ := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+sql, args)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s:\n%s", title, strings.Join(lines, "\n"))
}

// The claim and a Submit at a 100k-task backlog of one tenant with a
// thousand other tenants' tasks behind it. Their plans' figures (rows
// returned, buffers touched) are docs/queue.md's table "The claim on an
// index", and are asserted (buffers within 30 %): a change that moves
// them fails until the table moves too. With PGSTORE_MEASURE=1 (and -v)
// it prints the plans:
//
//	PGSTORE_MEASURE=1 go test -count=1 -v -run TestExplainClaimAtABacklog ./pgstore/
func TestExplainClaimAtABacklog(t *testing.T) {
	t.Parallel()
	s := measureDB(t)
	ctx := context.Background()
	// acme's 100k tasks take turns 0…99999; the others one turn each, as
	// Submit would give them.
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, turn)
		SELECT 'acme', 'o', 'image', 'gpu', 'main', 'a-' || g, 'f', g - 1 FROM generate_series(1, 100000) g;
		INSERT INTO idemgate_tasks (tenant, owner, kind, runtime, network, idempotency_key, fingerprint, turn)
		SELECT 'tenant-' || g, 'o', 'image', 'gpu', 'main', 'b-' || g, 'f', 0 FROM generate_series(1, 1000) g;
		ANALYZE idemgate_tasks`); err != nil {
		t.Fatal(err)
	}
	// want are the documented figures; rows of a limited claim count the
	// tasks taken and one row for the kind held back.
	check := func(title string, want planFigures, sql string, args pgx.NamedArgs) {
		t.Helper()
		if os.Getenv("PGSTORE_MEASURE") != "" {
			explain(t, s, title, sql, args)
		}
		var got planFigures
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sqlLockLimitedKinds, pgx.NamedArgs{"kinds": args["kinds"]}); err != nil {
				return err
			}
			got = explainFigures(t, tx, sql, args)
			return errRollback
		})
		if !errors.Is(err, errRollback) {
			t.Fatal(err)
		}
		t.Logf("%s: %+v (docs/queue.md: %+v)", title, got, want)
		if got.Rows != want.Rows || got.Buffers < want.Buffers*7/10 || got.Buffers > want.Buffers*13/10 {
			t.Errorf("%s: %+v; docs/queue.md says %+v (buffers within 30%%): fix the plan or the doc", title, got, want)
		}
	}
	want := []planFigures{{Buffers: 300, Rows: 16}, {Buffers: 317, Rows: 16}}
	for i, shape := range claimShapes[:2] {
		w := newWorker(t, s, WorkerConfig{Kinds: shape.kinds, Handler: func(context.Context, Task) Outcome { return Outcome{} }})
		w.limited.Store(false) // as after a claim that found no limits
		sql, args := w.claimStatement(16)
		check("claim of 16, "+shape.name+", no limits", want[i], sql, args)
	}
	if os.Getenv("PGSTORE_MEASURE") != "" {
		w := newWorker(t, s, WorkerConfig{Handler: func(context.Context, Task) Outcome { return Outcome{} }})
		_, args := w.claimStatement(16)
		explain(t, s, "FIFO claim of 16 (before), any kind", sqlClaimFIFO, args)
	}
	if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunning: 8, MaxRunningPerTenant: 2, StartsPerSecond: 100}); err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, s, WorkerConfig{Kinds: []string{"image"}, Handler: func(context.Context, Task) Outcome { return Outcome{} }})
	sql, args := w.claimStatement(16)
	check("claim of 16, literal kinds, with limits", planFigures{Buffers: 265, Rows: 9}, sql, args)
	nt := tenantTask("acme", "explain-submit")
	check("Submit of acme's next task", planFigures{Buffers: 30, Rows: 1}, sqlSubmit, pgx.NamedArgs{"tenant": nt.Tenant,
		"owner": nt.Owner, "kind": nt.Kind, "runtime": nt.Runtime, "network": nt.Network, "key": nt.IdempotencyKey,
		"fingerprint": nt.Fingerprint, "params": nil, "trace": "", "run_after": runAfterArg(nt.RunAfter),
		"priority": 0, "notify": false})
}

// The claim of a kind whose every tenant with work is at its
// MaxRunningPerTenant (1,000 tenants × 50 waiting tasks, each running
// one), against the same backlog with MaxRunning alone; and Submit beside
// a tenant's 100k tasks scheduled for tomorrow.
//
//	PGSTORE_MEASURE=1 go test -count=1 -v -run TestExplainClaimWithCappedTenants ./pgstore/
func TestExplainClaimWithCappedTenants(t *testing.T) {
	measuring(t)
	s := measureDB(t)
	ctx := context.Background()
	cappedBacklog(t, s, 1000, 0, 50)
	w := newWorker(t, s, WorkerConfig{Kinds: []string{"image"}, Handler: func(context.Context, Task) Outcome { return Outcome{} }})
	for _, l := range []KindLimits{{MaxRunning: 100_000}, {MaxRunningPerTenant: 1}} {
		if err := s.SetKindLimits(ctx, "image", l); err != nil {
			t.Fatal(err)
		}
		sql, args := w.claimStatement(16)
		explain(t, s, fmt.Sprintf("claim of 16 with %+v", l), sql, args)
		t.Logf("figures: %+v", claimPlan(t, s, []string{"image"}, 16))
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after, turn)
		SELECT 'planner', 'o', 'audio', 'gpu', 'main', 's-' || g, 'f', now() + interval '1 day', `+unplaced+`
		FROM generate_series(1, 100000) g`); err != nil { // as Submit stores them since v8 (turns g-1 before)
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, "ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
	nt := tenantTask("other", "beside-scheduled")
	nt.Kind = "audio"
	explain(t, s, "Submit beside a tenant's 100k scheduled tasks", sqlSubmit, pgx.NamedArgs{"tenant": nt.Tenant,
		"owner": nt.Owner, "kind": nt.Kind, "runtime": nt.Runtime, "network": nt.Network, "key": nt.IdempotencyKey,
		"fingerprint": nt.Fingerprint, "params": nil, "trace": "", "run_after": runAfterArg(nt.RunAfter),
		"priority": 0, "notify": false})
	aw := newWorker(t, s, WorkerConfig{Kinds: []string{"audio"}, Handler: func(context.Context, Task) Outcome { return Outcome{} }})
	sql, args := aw.claimStatement(16)
	explain(t, s, "claim of audio beside a tenant's 100k scheduled tasks", sql, args)
}

// sqlClaimFIFO is the claim before fair claiming (v5): highest priority,
// then oldest first, on an index of (priority DESC, run_after).
const sqlClaimFIFO = `WITH picked AS (
	SELECT id FROM idemgate_tasks
	WHERE state IN ('pending', 'retrying') AND run_after <= now()
		AND id <> ALL(coalesce(@held::uuid[], '{}'))
	ORDER BY priority DESC, run_after
	LIMIT @limit
	FOR UPDATE SKIP LOCKED
)
UPDATE idemgate_tasks t SET ` + claimSet + `
FROM picked WHERE t.id = picked.id
RETURNING ` + tTaskColumns + `, false AS duplicate`

// measureDB is a store whose database also has v5's index for
// sqlClaimFIFO.
func measureDB(t *testing.T) *Store {
	t.Helper()
	s, _ := setup(t)
	if _, err := s.pool.Exec(context.Background(), `CREATE INDEX idemgate_tasks_runnable_v5
		ON idemgate_tasks (priority DESC, run_after) WHERE state IN ('pending', 'retrying')`); err != nil {
		t.Fatal(err)
	}
	return s
}

// submitBacklog stores n tasks of tenants (in turn, as one client would
// submit them) in batches of a thousand.
func submitBacklog(t *testing.T, s *Store, prefix string, n int, tenants ...string) {
	t.Helper()
	for from := 0; from < n; from += 1000 {
		var batch []NewTask
		for i := from; i < min(n, from+1000); i++ {
			batch = append(batch, tenantTask(tenants[i%len(tenants)], fmt.Sprintf("%s-%d", prefix, i)))
		}
		if _, err := s.SubmitMany(context.Background(), batch); err != nil {
			t.Fatal(err)
		}
	}
}

// A lone task of tenant B submitted behind tenant A's 20k backlog (one
// worker, 16 slots, 5ms handler): how many attempts start, and how long,
// before B's, against an idle queue and against the FIFO claim.
//
//	PGSTORE_MEASURE=1 go test -count=1 -v -run TestMeasureFairness ./pgstore/
func TestMeasureFairness(t *testing.T) {
	measuring(t)
	s := measureDB(t)
	ctx := context.Background()
	for _, sc := range []struct {
		name    string
		backlog int
		fifo    bool
	}{
		{"idle queue", 0, false},
		{"fair claim, 20k backlog", 20000, false},
		{"FIFO claim (before), 20k backlog", 20000, true},
	} {
		if _, err := s.pool.Exec(ctx, "TRUNCATE idemgate_tasks"); err != nil {
			t.Fatal(err)
		}
		submitBacklog(t, s, "a", sc.backlog, "acme")
		var starts atomic.Int64
		var bStart atomic.Int64 // starts before B's, +1
		var bAt atomic.Pointer[time.Time]
		w := newWorker(t, s, WorkerConfig{Concurrency: 16, Handler: func(_ context.Context, task Task) Outcome {
			n := starts.Add(1)
			if task.Tenant == "beta" {
				now := time.Now()
				bAt.Store(&now)
				bStart.Store(n)
			}
			time.Sleep(5 * time.Millisecond)
			return Succeeded(json.RawMessage(`1`))
		}})
		if sc.fifo {
			w.test = &workerTestHooks{plainClaim: sqlClaimFIFO}
		}
		stop := runWorker(t, w)
		if sc.backlog > 0 {
			wait.For(t, patience, "the worker drains the backlog", func() bool { return starts.Load() >= 500 })
		}
		before := starts.Load()
		submitted := time.Now()
		mustSubmit(t, s, tenantTask("beta", "b-lone"))
		wait.For(t, 5*time.Minute, "B's task started", func() bool { return bAt.Load() != nil })
		stop()
		t.Logf("%-34s B waited %5d starts, %v", sc.name+":", bStart.Load()-before-1, bAt.Load().Sub(submitted).Round(time.Millisecond))
	}
}

// Drain throughput of one worker (16 slots, no-op handler) on a backlog
// of 5000 tasks of 500 tenants: the fair claim against the FIFO claim
// (before), in alternating rounds on the same backlog.
//
//	PGSTORE_MEASURE=1 go test -count=1 -v -run TestMeasureDrainCost ./pgstore/
func TestMeasureDrainCost(t *testing.T) {
	measuring(t)
	s := measureDB(t)
	ctx := context.Background()
	tenants := make([]string, 500)
	for i := range tenants {
		tenants[i] = fmt.Sprintf("tenant-%d", i)
	}
	const n = 5000
	rates := map[bool][]float64{}
	for round := range 10 {
		fifo := round%2 == 1
		if _, err := s.pool.Exec(ctx, "TRUNCATE idemgate_tasks"); err != nil {
			t.Fatal(err)
		}
		submitBacklog(t, s, "d", n, tenants...)
		if _, err := s.pool.Exec(ctx, "VACUUM ANALYZE idemgate_tasks"); err != nil {
			t.Fatal(err)
		}
		w := newWorker(t, s, WorkerConfig{Concurrency: 16,
			Handler: func(context.Context, Task) Outcome { return Succeeded(json.RawMessage(`1`)) }})
		if fifo {
			w.test = &workerTestHooks{plainClaim: sqlClaimFIFO}
		}
		began := time.Now()
		stop := runWorker(t, w)
		wait.For(t, 5*time.Minute, "the backlog drained", func() bool { return countRows(t, s.pool, "state = 'succeeded'") == n })
		took := time.Since(began)
		stop()
		rates[fifo] = append(rates[fifo], n/took.Seconds())
		t.Logf("round %d, %s: %.0f tasks/s, %d claims", round+1, map[bool]string{false: "fair", true: "FIFO"}[fifo], n/took.Seconds(), w.claims.Load())
	}
	median := func(xs []float64) float64 { slices.Sort(xs); return xs[len(xs)/2] }
	t.Logf("median drain: fair %.0f tasks/s, FIFO %.0f tasks/s: fair/FIFO = %.2f×",
		median(rates[false]), median(rates[true]), median(rates[false])/median(rates[true]))
}

// How long a finished task waits to show its state: from the handler's
// return to the row's update (the database's clock, on the same host),
// one task at a time, on an idle queue and while another handler of the
// worker runs (then the completer holds the outcome up to
// CompletionWait, DefaultCompletionWait here, for others to join it).
//
//	PGSTORE_MEASURE=1 go test -count=1 -v -run TestMeasureCompletionDelay ./pgstore/
func TestMeasureCompletionDelay(t *testing.T) {
	measuring(t)
	for _, busy := range []bool{false, true} {
		s, _ := setup(t)
		ctx := context.Background()
		attemptLog(t, s.pool)
		var mu sync.Mutex
		returned := map[string]time.Time{}
		unblock := make(chan struct{})
		stop := runWorker(t, newWorker(t, s, WorkerConfig{Handler: func(_ context.Context, task Task) Outcome {
			if task.IdempotencyKey == "blocker" {
				<-unblock
				return Succeeded(json.RawMessage(`1`))
			}
			mu.Lock()
			returned[task.ID] = time.Now()
			mu.Unlock()
			return Succeeded(json.RawMessage(`1`))
		}}))
		if busy {
			waitState(t, s, mustSubmit(t, s, newTask("blocker")).ID, StateRunning)
		}
		const n = 200
		for i := range n {
			task := mustSubmit(t, s, newTask(fmt.Sprintf("delay-%d", i)))
			waitState(t, s, task.ID, StateSucceeded)
		}
		close(unblock)
		stop()
		rows, _ := s.pool.Query(ctx, `SELECT id::text, min(at) FROM idemgate_test_attempts WHERE state = 'succeeded' GROUP BY id`)
		type done struct {
			ID string
			At time.Time
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[done])
		if err != nil {
			t.Fatal(err)
		}
		var delays []time.Duration
		mu.Lock()
		for _, d := range got {
			if at, ok := returned[d.ID]; ok {
				delays = append(delays, d.At.Sub(at))
			}
		}
		mu.Unlock()
		slices.Sort(delays)
		t.Logf("completion delay %s, %d tasks: p50 %v, p99 %v, max %v",
			map[bool]string{false: "on an idle queue", true: "while another handler runs"}[busy], len(delays),
			delays[len(delays)/2], delays[len(delays)*99/100], delays[len(delays)-1])
	}
}

// SubmitMany's statement for a batch of 100 new keys (10 tenants) at a
// table of 20k tasks, and for the same batch again (every key held).
//
//	PGSTORE_MEASURE=1 go test -count=1 -v -run TestExplainSubmitMany ./pgstore/
func TestExplainSubmitMany(t *testing.T) {
	measuring(t)
	s, _ := setup(t)
	submitBacklog(t, s, "old", 20000, "acme", "beta")
	if _, err := s.pool.Exec(context.Background(), "VACUUM ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
	batch := make([]NewTask, 100)
	idx := make([]int, len(batch))
	for i := range batch {
		batch[i] = tenantTask(fmt.Sprintf("tenant-%d", i%10), fmt.Sprintf("new-%d", i))
		idx[i] = i
	}
	explain(t, s, "SubmitMany of 100 new keys", sqlSubmitMany, batchArgs(batch, idx, []string{"image"}))
	if _, err := s.SubmitMany(context.Background(), batch); err != nil {
		t.Fatal(err)
	}
	explain(t, s, "SubmitMany of 100 held keys", sqlSubmitMany, batchArgs(batch, idx, []string{"image"}))
}

// The claim of 16 in the middle of a drain: 8000 tasks of one tenant, of
// which 3200 were claimed and finished 16 at a time (their entries in
// the claim index are dead, not yet vacuumed), as in `make river`'s drain
// row.
//
//	PGSTORE_MEASURE=1 go test -count=1 -v -run TestExplainClaimMidDrain ./pgstore/
func TestExplainClaimMidDrain(t *testing.T) {
	measuring(t)
	s, _ := setup(t)
	ctx := context.Background()
	submitBacklog(t, s, "drain", 8000, "bench")
	w := newWorker(t, s, WorkerConfig{Kinds: []string{"image"}, Handler: func(context.Context, Task) Outcome { return Outcome{} }})
	w.limited.Store(false)
	for range 200 {
		sql, args := w.claimStatement(16)
		claimed, err := w.runClaim(ctx, sql, args)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		var attempts []int
		for _, c := range claimed {
			ids, attempts = append(ids, c.ID), append(attempts, c.Attempt)
		}
		n := len(ids)
		if _, err := s.pool.Exec(ctx, sqlFinishBatch, pgx.NamedArgs{"ids": ids, "attempts": attempts,
			"states": slices.Repeat([]string{"succeeded"}, n), "results": slices.Repeat([]string{"[]"}, n),
			"errors": slices.Repeat([]string{""}, n)}); err != nil {
			t.Fatal(err)
		}
	}
	sql, args := w.claimStatement(16)
	explain(t, s, "claim of 16 mid-drain", sql, args)
}

// planFigures are the stable figures of a statement's plan: the buffers
// it touched (shared hits and reads, of the whole plan) and the rows its
// top node returned. Unlike its time, they do not move with the load.
type planFigures struct {
	Buffers int
	Rows    int
}

// claimPlan runs the claim of a worker for kinds, for up to n tasks, under
// EXPLAIN (ANALYZE, BUFFERS) after the lock statement the worker sends
// before a limited claim, in a transaction it rolls back, and returns its
// figures. Without the locks, a limited kind has no room in the claim and
// nothing of it is read.
func claimPlan(t testing.TB, s *Store, kinds []string, n int) planFigures {
	t.Helper()
	ctx := context.Background()
	w := newWorker(t, s, WorkerConfig{Kinds: kinds, Handler: func(context.Context, Task) Outcome { return Outcome{} }})
	sql, args := w.claimStatement(n)
	var pf planFigures
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var jit string
		var locked int
		var limited bool
		if err := tx.QueryRow(ctx, sqlLockLimitedKinds, pgx.NamedArgs{"kinds": kinds}).Scan(&jit, &locked, &limited); err != nil {
			return err
		}
		pf = explainFigures(t, tx, sql, args)
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	return pf
}

// explainFigures runs sql under EXPLAIN (ANALYZE, BUFFERS) in tx and
// returns its figures.
func explainFigures(t testing.TB, tx pgx.Tx, sql string, args pgx.NamedArgs) planFigures {
	t.Helper()
	var plan []map[string]any
	if err := tx.QueryRow(context.Background(), "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	top := plan[0]["Plan"].(map[string]any)
	return planFigures{Buffers: int(top["Shared Hit Blocks"].(float64) + top["Shared Read Blocks"].(float64)),
		Rows: int(top["Actual Rows"].(float64))}
}

// cappedBacklog stores, for each of tenants tenants of kind image
// ("capped-0", …), waiting tasks waiting each (turns from first on, as
// Submit gives a tenant's backlog) and one attempt holding a lease for
// an hour: at a MaxRunningPerTenant of 1, every one of them is capped.
// Then it analyzes the table.
func cappedBacklog(t testing.TB, s *Store, tenants, first, waiting int) {
	t.Helper()
	ctx := context.Background()
	for _, sql := range []string{`INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after, turn)
		SELECT 'capped-' || g % $1::int, 'o', 'image', 'gpu', 'main', 'w-' || (g / $1::int + $2::int) || '-' || g % $1::int, 'f',
			now() - interval '1 hour', g / $1 + $2
		FROM generate_series(0, $1::int * $3::int - 1) g`, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, state, attempt, tries,
			lease_until, locked_by, turn)
		SELECT 'capped-' || g, 'o', 'image', 'gpu', 'main', 'r-' || g, 'f', 'running', 1, 1,
			now() + interval '1 hour', 'elsewhere', 0
		FROM generate_series(0, $1 - 1) g WHERE $2::int = 0 AND $3::int >= 0`} {
		if _, err := s.pool.Exec(ctx, sql, tenants, first, waiting); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.pool.Exec(ctx, "ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
}

// submitPlan runs Submit's statement for nt under EXPLAIN (ANALYZE,
// BUFFERS) in a transaction it rolls back, and returns its figures.
func submitPlan(t testing.TB, s *Store, nt NewTask) planFigures {
	t.Helper()
	ctx := context.Background()
	var pf planFigures
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		pf = explainFigures(t, tx, sqlSubmit, pgx.NamedArgs{"tenant": nt.Tenant, "owner": nt.Owner,
			"kind": nt.Kind, "runtime": nt.Runtime, "network": nt.Network, "key": nt.IdempotencyKey,
			"fingerprint": nt.Fingerprint, "params": nil, "trace": "", "run_after": runAfterArg(nt.RunAfter),
			"priority": nt.Priority, "notify": false})
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	return pf
}

// limitedWorkFigures are the plan figures of claims that pass limited
// work by, as docs/queue.md's table "Claims beside limited work" has them.
type limitedWorkFigures struct {
	small, uncapped, capped, paused, scheduled planFigures
}

// docLimitedWork is docs/queue.md's table "Claims beside limited work".
var docLimitedWork = limitedWorkFigures{
	small:     planFigures{Buffers: 213, Rows: 16},
	uncapped:  planFigures{Buffers: 335, Rows: 16},
	capped:    planFigures{Buffers: 83, Rows: 0},
	paused:    planFigures{Buffers: 300, Rows: 17},
	scheduled: planFigures{Buffers: 330, Rows: 16},
}

// TestExplainClaimPassesLimitedWorkBy checks the plans of claims beside
// work that limits keep waiting, against a claim of the same batch on a
// small queue: a kind whose 1,000 tenants with work (50 waiting tasks
// each) are all at MaxRunningPerTenant 1, against the same backlog under
// MaxRunning alone; a worker of a paused kind with 20k waiting tasks and
// of another kind with 16; and the claim of 16 due tasks beside another
// tenant's 100k tasks scheduled for tomorrow. Buffers and rows are stable
// figures: rows exactly, buffers within 15 % of docs/queue.md, and the
// capped claim at most twice the uncapped one (it read 4,365 buffers,
// 13x, walking the capped tenants on the tenant_turn index).
//
//	go test -count=1 -v -run TestExplainClaimPassesLimitedWorkBy ./pgstore/
func TestExplainClaimPassesLimitedWorkBy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	small, _ := setup(t)
	for i := range 16 {
		nt := tenantTask(fmt.Sprintf("other-%d", i%4), fmt.Sprintf("audio-%d", i))
		nt.Kind = "audio"
		mustSubmit(t, small, nt)
	}
	// plan returns the figures of the claim of 16 of kinds (and prints

	// it with PGSTORE_MEASURE=1, after: a claim run under EXPLAIN ANALYZE
	// and rolled back leaves row versions that the next one reads).
	plan := func(s *Store, title string, kinds ...string) planFigures {
		pf := claimPlan(t, s, kinds, 16)
		if os.Getenv("PGSTORE_MEASURE") != "" {
			w := newWorker(t, s, WorkerConfig{Kinds: kinds, Handler: func(context.Context, Task) Outcome { return Outcome{} }})
			sql, args := w.claimStatement(16)
			explain(t, s, title, sql, args)
		}
		return pf
	}
	var got limitedWorkFigures
	got.small = plan(small, "small queue", "audio")

	s, _ := setup(t)
	cappedBacklog(t, s, 1000, 0, 50)
	for i := range 16 {
		nt := tenantTask(fmt.Sprintf("other-%d", i%4), fmt.Sprintf("audio-%d", i))
		nt.Kind = "audio"
		mustSubmit(t, s, nt)
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after, turn)
		SELECT 'planner', 'o', 'audio', 'gpu', 'main', 's-' || g, 'f', now() + interval '1 day', `+unplaced+`
		FROM generate_series(1, 100000) g;
		INSERT INTO idemgate_tasks (tenant, owner, kind, runtime, network, idempotency_key, fingerprint, turn)
		SELECT 'v-' || g % 100, 'o', 'video', 'gpu', 'main', 'v-' || g, 'f', g / 100 FROM generate_series(0, 19999) g;
		ANALYZE idemgate_tasks; ANALYZE idemgate_waiting_tenants`); err != nil {
		t.Fatal(err)
	}
	if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunning: 100_000}); err != nil {
		t.Fatal(err)
	}
	got.uncapped = plan(s, "1,000 tenants x 50, MaxRunning", "image")
	if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunningPerTenant: 1}); err != nil {
		t.Fatal(err)
	}
	got.capped = plan(s, "1,000 tenants x 50, all capped", "image")
	if err := s.SetKindLimits(ctx, "video", KindLimits{Paused: true}); err != nil {
		t.Fatal(err)
	}
	got.paused = plan(s, "a paused kind's 20k beside 16", "video", "audio")
	got.scheduled = plan(s, "16 beside 100k scheduled", "audio")
	t.Logf("claims of 16: small queue %+v; 1,000 tenants x 50 under MaxRunning %+v, all capped %+v; "+
		"paused kind beside %+v; beside 100k scheduled %+v", got.small, got.uncapped, got.capped, got.paused, got.scheduled)
	if got.capped.Buffers > 2*got.uncapped.Buffers {
		t.Errorf("the claim beside 1,000 capped tenants read %d buffers, more than twice the uncapped claim's %d",
			got.capped.Buffers, got.uncapped.Buffers)
	}
	for _, c := range []struct {
		name      string
		got, want planFigures
	}{
		{"small queue", got.small, docLimitedWork.small},
		{"1,000 tenants x 50, MaxRunning", got.uncapped, docLimitedWork.uncapped},
		{"1,000 tenants x 50, all capped", got.capped, docLimitedWork.capped},
		{"a paused kind's 20k beside 16", got.paused, docLimitedWork.paused},
		{"16 beside 100k scheduled", got.scheduled, docLimitedWork.scheduled},
	} {
		if c.got.Rows != c.want.Rows || c.got.Buffers < c.want.Buffers*85/100 || c.got.Buffers > c.want.Buffers*115/100 {
			t.Errorf("%s: %+v; docs/queue.md says %+v (buffers within 15%%): fix the plan or the doc", c.name, c.got, c.want)
		}
	}
}
