package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemgate/idemgate/internal/wait"
)

// Scheduled tasks of many tenants come due at once and several workers'
// claims place them (the promoted CTE), each on its own set of rows
// (SKIP LOCKED), the lines not yet listed. Each placed row lists its
// line; claims racing must neither deadlock nor leave a line unlisted.
func TestClaimsPlacingDueTasksOfNewLinesConcurrently(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	for round := range 2 {
		var batch []NewTask
		for i := range 800 {
			nt := tenantTask(fmt.Sprintf("r%d-t%03d", round, i%150), fmt.Sprintf("r%d-k%d", round, i))
			nt.RunAfter = time.Now().Add(time.Hour)
			batch = append(batch, nt)
		}
		if _, err := s.SubmitMany(ctx, batch); err != nil {
			t.Fatal(err)
		}
		// Due now, in an order that mixes the lines.
		if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET run_after = now() - random() * interval '10 seconds'
			WHERE turn = -1`); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w := newWorker(t, s, WorkerConfig{Kinds: []string{"other-kind"}, Handler: func(context.Context, Task) Outcome { return Outcome{} }})
				sql, args := w.claimStatement(1)
				if _, err := w.runClaim(ctx, sql, args); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("round %d: claim: %v", round, err)
		}
		if t.Failed() {
			return
		}
	}
	if n := orphanLines(t, s); n != 0 {
		t.Fatalf("%d lines unlisted", n)
	}
}

// capTenants makes n tenants of kind image capped at MaxRunningPerTenant
// 1 (one attempt each holding a lease) with a backlog of 20 due tasks
// each, all at turn 0, so that a claim's window of candidates is full of
// capped tenants' tasks and the claim walks idemgate_waiting_tenants to
// find any other tenant.
func capTenants(t *testing.T, s *Store, n int) {
	t.Helper()
	ctx := context.Background()
	if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunningPerTenant: 1}); err != nil {
		t.Fatal(err)
	}
	var batch []NewTask
	for i := range n {
		for j := range 21 {
			batch = append(batch, tenantTask(fmt.Sprintf("capped-%02d", i), fmt.Sprintf("c-%d-%d", i, j)))
		}
	}
	if _, err := s.SubmitMany(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET turn = 0, run_after = now() - interval '1 hour'
		WHERE tenant LIKE 'capped-%'`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'running', attempt = 1, tries = 1,
		lease_until = now() + interval '1 hour', locked_by = 'elsewhere'
		WHERE id IN (SELECT DISTINCT ON (tenant) id FROM idemgate_tasks WHERE tenant LIKE 'capped-%' ORDER BY tenant, id)`); err != nil {
		t.Fatal(err)
	}
}

// Every way a finished or running task comes back to wait, with its
// line swept while it had no waiting task: the line is listed again, and
// a claim that must walk the lines past capped tenants (the window of
// candidates is full of their backlog) finds the task and takes it. A
// line left unlisted would keep its task waiting for as long as the
// other tenants stay capped.
func TestEveryWayBackToWaitingIsClaimedPastCappedTenants(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		given string // SQL SET clause that ends or starts the task
		when  func(t *testing.T, s *Store, task Task)
	}{
		{name: "Recover", given: `state = 'failed', results = '[1]', finished_at = now()`,
			when: func(t *testing.T, s *Store, task Task) {
				if _, err := s.Recover(context.Background(), task.Tenant, task.Owner, task.ID); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "Operator.Retry", given: `state = 'failed', finished_at = now()`,
			when: func(t *testing.T, s *Store, task Task) {
				if _, err := s.Operator().Retry(context.Background(), task.ID); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "rescue of an expired lease", given: `state = 'running', attempt = 1, tries = 1, lost = 'retry',
			locked_by = 'dead', lease_until = now() - interval '1 second'`,
			when: func(t *testing.T, s *Store, task Task) {
				w := newWorker(t, s, WorkerConfig{BackoffBase: 1, BackoffMax: 1,
					Handler: func(context.Context, Task) Outcome { return Outcome{} }})
				if n, err := w.rescuer.rescue(context.Background()); err != nil || n != 1 {
					t.Fatalf("rescue = %d, %v; want 1", n, err)
				}
			}},
		{name: "SubmitTx committed after another rolled back", given: `state = 'succeeded', finished_at = now()`,
			when: func(t *testing.T, s *Store, task Task) {
				ctx := context.Background()
				tx, err := s.pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := s.SubmitTx(ctx, tx, tenantTask(task.Tenant, "rolled-back")); err != nil {
					t.Fatal(err)
				}
				if err := tx.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
				if err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
					_, err := s.SubmitTx(ctx, tx, tenantTask(task.Tenant, "committed"))
					return err
				}); err != nil {
					t.Fatal(err)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, _ := setup(t)
			ctx := context.Background()
			capTenants(t, s, 6)
			task := mustSubmit(t, s, tenantTask("victim", "v-1"))
			if _, err := s.pool.Exec(ctx, "UPDATE idemgate_tasks SET "+tt.given+" WHERE id = $1::uuid", task.ID); err != nil {
				t.Fatal(err)
			}
			sweepAll(t, s)
			if slices.Contains(waitingLines(t, s), "image/0/victim") {
				t.Fatal("the sweep left the victim's empty line")
			}
			tt.when(t, s, task)
			if n := orphanLines(t, s); n != 0 {
				t.Fatalf("%d lines with waiting tasks unlisted: %v", n, waitingLines(t, s))
			}
			sweepAll(t, s) // a sweep now keeps the line
			var got []string
			for range 3 {
				for _, c := range claimNow(t, s, []string{"image"}, 1) {
					got = append(got, c.Tenant)
				}
			}
			if !slices.Contains(got, "victim") {
				t.Fatalf("claims past capped tenants took %v; want the victim's task", got)
			}
			for _, tenant := range got {
				if tenant != "victim" {
					t.Fatalf("a claim took a task of capped tenant %s (MaxRunningPerTenant 1)", tenant)
				}
			}
		})
	}
}

// A rolling upgrade: v8 nodes keep submitting (single tasks and batches,
// new tenants and known ones) while one node migrates to v9. Every line
// with a waiting task ends up listed, whether its task was committed
// before the migration's lock, waited for it, or came after; a rerun of
// Migrate does nothing.
func TestMigrateToV9BesideSubmits(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx := context.Background()
	s := newStore(db.pool(t))
	s.test = &storeTestHooks{migrateSkip: []int{9, 11}}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	writers := newStore(db.pool(t))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var written sync.Map
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				var err error
				if g%2 == 0 {
					_, err = writers.Submit(ctx, tenantTask(fmt.Sprintf("g%d-t%d", g, i%40), fmt.Sprintf("g%d-%d", g, i)))
				} else {
					var batch []NewTask
					for j := range 5 {
						batch = append(batch, tenantTask(fmt.Sprintf("g%d-t%d", g, (i*5+j)%60), fmt.Sprintf("g%d-%d-%d", g, i, j)))
					}
					_, err = writers.SubmitMany(ctx, batch)
				}
				if err != nil {
					t.Errorf("writer %d: %v", g, err)
					return
				}
				written.Store(g, i)
			}
		}()
	}
	// Some tasks before the migration, the migration among the writes.
	if !wait.Until(patience, func() bool { _, ok := written.Load(3); return ok }) {
		t.Fatal("no batch was written before the migration")
	}
	s.test = nil
	err := s.Migrate(ctx)
	// Writes after v9 too.
	after := 0
	if v, ok := written.Load(0); ok {
		after = v.(int) + 20
	}
	if !wait.Until(patience, func() bool { v, ok := written.Load(0); return ok && v.(int) >= after }) {
		t.Error("no writes after v9")
	}
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if n := orphanLines(t, s); n != 0 {
		t.Fatalf("%d lines with waiting tasks unlisted after v9 beside writers", n)
	}
	var lines, tasks int
	if err := s.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM idemgate_waiting_tenants), (SELECT count(*) FROM idemgate_tasks)`).
		Scan(&lines, &tasks); err != nil {
		t.Fatal(err)
	}
	if lines == 0 || tasks < 20 {
		t.Fatalf("%d lines of %d tasks: the writers wrote too little for the test to mean anything", lines, tasks)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	vs, err := s.MigrationStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		if !v.Applied {
			t.Fatalf("version %+v not applied", v)
		}
	}
	if last := vs[len(vs)-1]; last.Version < 9 {
		t.Fatalf("last version %+v; want 9 or later", last)
	}
}

// Three workers drain a kind whose tenants with the most work are nearly
// all at MaxRunningPerTenant, so that claims walk idemgate_waiting_tenants
// past them, while other tenants' tasks keep arriving (new lines) and
// sweeps run all along: MaxRunning and MaxRunningPerTenant hold exactly,
// and every task runs (a line swept while its task was being written
// would leave that task waiting for ever).
func TestKindLimitsHoldWhileClaimsWalkPastCappedTenants(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	ctx := context.Background()
	attemptLog(t, s.pool)
	const maxRunning, perTenant = 24, 1
	if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunning: maxRunning, MaxRunningPerTenant: perTenant}); err != nil {
		t.Fatal(err)
	}
	var heavy []NewTask
	for i := range 30 {
		for j := range 12 {
			heavy = append(heavy, tenantTask(fmt.Sprintf("heavy-%02d", i), fmt.Sprintf("h-%d-%d", i, j)))
		}
	}
	if _, err := s.SubmitMany(ctx, heavy); err != nil {
		t.Fatal(err)
	}
	// All at turn 0: a claim's window of candidates is the heavy
	// tenants' backlog, and the light tenants are found by the walk.
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET turn = 0`); err != nil {
		t.Fatal(err)
	}
	cfg := WorkerConfig{Concurrency: 16, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
		Handler: func(ctx context.Context, _ Task) Outcome {
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Millisecond):
			}
			return Succeeded(json.RawMessage(`1`))
		}}
	for range 3 {
		runWorker(t, newWorker(t, newStore(db.pool(t)), cfg))
	}
	const light, each = 40, 3
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := range light {
			for j := range each {
				if _, err := s.Submit(ctx, tenantTask(fmt.Sprintf("light-%02d", i), fmt.Sprintf("l-%d-%d", i, j))); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	go func() {
		defer wg.Done()
		r := &rescuer{pool: s.pool}
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := r.sweepWaiting(ctx); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	total := len(heavy) + light*each
	ok := wait.Until(patience, func() bool { return countRows(t, s.pool, "state = 'succeeded'") == total })
	close(stop)
	wg.Wait()
	if !ok {
		t.Fatalf("%d of %d tasks succeeded; %d lines with waiting tasks unlisted", countRows(t, s.pool, "state = 'succeeded'"),
			total, orphanLines(t, s))
	}
	ivs := attemptIntervals(t, s.pool)
	if got := maxOverlap(ivs, ""); got > maxRunning {
		t.Fatalf("%d attempts held a lease at once; want ≤ MaxRunning %d", got, maxRunning)
	}
	tenants := map[string]bool{}
	for _, iv := range ivs {
		tenants[iv.tenant] = true
	}
	for tenant := range tenants {
		if got := maxOverlap(ivs, tenant); got > perTenant {
			t.Fatalf("%s had %d attempts at once; want ≤ MaxRunningPerTenant %d", tenant, got, perTenant)
		}
	}
	t.Logf("%d attempts of %d tenants; at most %d at once", len(ivs), len(tenants), maxOverlap(ivs, ""))
}

// Two handlers' transactions each submit a task of two tenants whose
// lines are not yet listed, in opposite orders, and commit. Their tasks
// have distinct keys: before v9 neither waited for the other. Both must
// commit, neither get deadlock_detected (40P01).
func TestSubmitTxOfNewLinesInOppositeOrdersCommit(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	for round := range 5 {
		ctx := hangBound(t)
		a, b := "a-"+string(rune('0'+round)), "b-"+string(rune('0'+round))
		orders := [][2]string{{a, b}, {b, a}}
		var firstDone sync.WaitGroup
		firstDone.Add(2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i, order := range orders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
					if _, err := s.SubmitTx(ctx, tx, tenantTask(order[0], "first-"+order[0]+"-"+string(rune('0'+i)))); err != nil {
						firstDone.Done()
						return err
					}
					// Both have written their first task before either
					// writes its second.
					firstDone.Done()
					firstDone.Wait()
					_, err := s.SubmitTx(ctx, tx, tenantTask(order[1], "second-"+order[1]+"-"+string(rune('0'+i))))
					return err
				})
			}()
		}
		wg.Wait()
		for i, err := range errs {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "40P01" {
				t.Fatalf("round %d: transaction %d: deadlock: %v", round, i, err)
			}
			if err != nil {
				t.Fatalf("round %d: transaction %d: %v", round, i, err)
			}
		}
	}
	if n := orphanLines(t, s); n != 0 {
		t.Fatalf("%d lines unlisted", n)
	}
}

// A handler's transaction that submits a task of a new line and stays
// open (its own slow writes) must not hold up other Submits of that
// line: before v9, Submits of distinct keys never waited for each other.
func TestSubmitBesideAnOpenTransactionOfItsNewLine(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := s.SubmitTx(ctx, tx, tenantTask("fresh", "held-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Submit(hangBound(t), tenantTask("fresh", "other-1")); err != nil {
		t.Fatalf("Submit of a line another transaction holds open: %v", err)
	}
}

// A worker died holding one task of each of many tenants; their lines,
// empty while the tasks ran, were swept. Its rescue (one statement, rows
// in lease order) runs while clients submit batches for the same tenants
// (lines listed in sorted order). Neither may get deadlock_detected.
func TestRescueBesideSubmitManyOfSweptLines(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	w := newWorker(t, s, WorkerConfig{BackoffBase: 1, BackoffMax: 1, Handler: func(context.Context, Task) Outcome { return Outcome{} }})
	for round := range 5 {
		// A round took 1–2.6 s here at load 11, and over 3 s in CI at
		// load 19 (15 s for all five ran out): each has its own bound.
		ctx := hangBound(t)
		var batch []NewTask
		for i := range 200 {
			batch = append(batch, tenantTask(fmt.Sprintf("r%d-t%03d", round, i), fmt.Sprintf("r%d-held-%d", round, i)))
		}
		if _, err := s.SubmitMany(ctx, batch); err != nil {
			t.Fatal(err)
		}
		// Running, the leases of the tenants named last lapsed first: the
		// rescue lists their lines in the opposite order to a batch's.
		if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'running', attempt = 1, tries = 1, lost = 'retry',
			locked_by = 'dead', lease_until = now() - right(tenant, 3)::int * interval '1 second' WHERE state = 'pending'`); err != nil {
			t.Fatal(err)
		}
		sweepAll(t, s)
		var more []NewTask
		for i := range 200 {
			more = append(more, tenantTask(fmt.Sprintf("r%d-t%03d", round, i), fmt.Sprintf("r%d-new-%d", round, i)))
		}
		var wg sync.WaitGroup
		var rerr, serr error
		wg.Add(2)
		go func() { defer wg.Done(); _, rerr = w.rescuer.rescue(ctx) }()
		go func() { defer wg.Done(); _, serr = s.SubmitMany(ctx, more) }()
		wg.Wait()
		if rerr != nil || serr != nil {
			t.Fatalf("round %d: rescue: %v; SubmitMany: %v", round, rerr, serr)
		}
		if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'succeeded', finished_at = now()`); err != nil {
			t.Fatal(err)
		}
	}
}

// A handler's transaction submits the first task of a tenant's line and
// stays open (its own slow writes). Meanwhile a scheduled task of that
// tenant comes due and a worker's claim places it, which lists the same
// line. The claim must not wait for the handler's transaction: it holds
// the kind's lock, so every claim of the kind would wait with it.
func TestClaimBesideAnOpenTransactionOfANewLine(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunning: 100}); err != nil {
		t.Fatal(err)
	}
	later := tenantTask("fresh", "scheduled")
	later.RunAfter = time.Now().Add(time.Hour)
	mustSubmit(t, s, later)
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET run_after = now() - interval '1 second' WHERE tenant = 'fresh'`); err != nil {
		t.Fatal(err)
	}
	// The claim takes another tenant's task of a higher priority, and
	// places the due one.
	first := tenantTask("other", "o-1")
	first.Priority = 5
	mustSubmit(t, s, first)
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := s.SubmitTx(ctx, tx, tenantTask("fresh", "in-handler")); err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, s, WorkerConfig{Kinds: []string{"image"}, Handler: func(context.Context, Task) Outcome { return Outcome{} }})
	w.limited.Store(true)
	// The claim needs no wait at all.
	sql, args := w.claimStatement(1)
	got, err := w.runClaim(hangBound(t), sql, args)
	if err != nil {
		t.Fatalf("a claim of image beside a handler's open transaction: %v", err)
	}
	if len(got) != 1 {
		t.Fatalf("claimed %d tasks; want 1", len(got))
	}
}
