package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/wait"
)

func TestKindLimitsAreStoredAndValidated(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	if got, err := s.KindLimits(ctx, "never-set"); err != nil || got != (KindLimits{}) {
		t.Fatalf("KindLimits of a kind never set = %+v, %v; want the zero value", got, err)
	}
	tests := []struct {
		name    string
		given   KindLimits
		wantErr bool
	}{
		{name: "all set", given: KindLimits{MaxRunning: 8, MaxRunningPerTenant: 2, StartsPerSecond: 2.5, Paused: true}},
		{name: "paused only", given: KindLimits{Paused: true}},
		{name: "zero removes", given: KindLimits{}},
		{name: "negative MaxRunning", given: KindLimits{MaxRunning: -1}, wantErr: true},
		{name: "negative MaxRunningPerTenant", given: KindLimits{MaxRunningPerTenant: -1}, wantErr: true},
		{name: "MaxRunning past int32", given: KindLimits{MaxRunning: math.MaxInt32 + 1}, wantErr: true},
		{name: "negative rate", given: KindLimits{StartsPerSecond: -0.5}, wantErr: true},
		{name: "NaN rate", given: KindLimits{StartsPerSecond: math.NaN()}, wantErr: true},
		{name: "infinite rate", given: KindLimits{StartsPerSecond: math.Inf(1)}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, err := s.KindLimits(ctx, "image")
			if err != nil {
				t.Fatal(err)
			}
			err = s.SetKindLimits(ctx, "image", tt.given)
			if (err != nil) != tt.wantErr {
				t.Fatalf("SetKindLimits(%+v) = %v; want error %v", tt.given, err, tt.wantErr)
			}
			want := tt.given
			if tt.wantErr {
				want = before
			}
			if got, err := s.KindLimits(ctx, "image"); err != nil || got != want {
				t.Fatalf("KindLimits = %+v, %v; want %+v", got, err, want)
			}
		})
	}
	if err := s.SetKindLimits(ctx, "", KindLimits{MaxRunning: 1}); err == nil {
		t.Fatal("SetKindLimits of an empty kind: no error")
	}
}

// attemptLog records, by the database's clock, every claim of a task
// and every change of its state or lease, so that a test can see how
// many attempts held a lease at once.
func attemptLog(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `
CREATE TABLE idemgate_test_attempts (id uuid, attempt int, tenant text, state text, lease_until timestamptz,
	worker text, at timestamptz DEFAULT clock_timestamp(), stmt timestamptz DEFAULT statement_timestamp());
CREATE FUNCTION idemgate_test_log_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO idemgate_test_attempts (id, attempt, tenant, state, lease_until, worker)
	VALUES (NEW.id, NEW.attempt, NEW.tenant, NEW.state, NEW.lease_until, NEW.locked_by);
	RETURN NEW;
END $$;
CREATE TRIGGER log_attempt AFTER UPDATE ON idemgate_tasks FOR EACH ROW
	WHEN (OLD.attempt IS DISTINCT FROM NEW.attempt OR OLD.state IS DISTINCT FROM NEW.state
		OR OLD.lease_until IS DISTINCT FROM NEW.lease_until)
	EXECUTE FUNCTION idemgate_test_log_attempt();`); err != nil {
		t.Fatal(err)
	}
}

// interval is an attempt's hold on its task: from its claim until it
// left the running state or its last lease ended, whichever came first.
type interval struct {
	tenant     string
	start, end time.Time
	claimed    time.Time // the start of the claim's statement: the token bucket's clock
}

// attemptIntervals reads the attempts of running tasks from the log.
func attemptIntervals(t testing.TB, pool *pgxpool.Pool) []interval {
	t.Helper()
	rows, _ := pool.Query(context.Background(), `
SELECT min(tenant), min(at) FILTER (WHERE state = 'running') AS start,
	min(stmt) FILTER (WHERE state = 'running') AS claimed,
	least(coalesce(min(at) FILTER (WHERE state <> 'running'), 'infinity'),
		coalesce(max(lease_until) FILTER (WHERE state = 'running'), 'infinity')) AS end
FROM idemgate_test_attempts GROUP BY id, attempt
HAVING min(at) FILTER (WHERE state = 'running') IS NOT NULL`)
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (interval, error) {
		var iv interval
		var end pgtypeTime
		err := r.Scan(&iv.tenant, &iv.start, &iv.claimed, &end)
		iv.end = end.t
		return iv, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// pgtypeTime scans a timestamptz that may be infinity (as the far future).
type pgtypeTime struct{ t time.Time }

func (p *pgtypeTime) Scan(src any) error {
	switch v := src.(type) {
	case time.Time:
		p.t = v
	default:
		p.t = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	return nil
}

// maxOverlap is the largest number of intervals (of tenant, or of all
// when tenant is "") that were open at one instant; an interval ending
// at the instant another starts does not overlap it.
func maxOverlap(ivs []interval, tenant string) int {
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, iv := range ivs {
		if tenant == "" || iv.tenant == tenant {
			edges = append(edges, edge{iv.start, 1}, edge{iv.end, -1})
		}
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta // ends first
	})
	open, most := 0, 0
	for _, e := range edges {
		open += e.delta
		most = max(most, open)
	}
	return most
}

// A cluster-wide MaxRunning and MaxRunningPerTenant hold while four
// workers on separate pools race for the last slots, and while one of
// them is killed with attempts running: those count until their lease
// ends, and are rescued after.
func TestKindLimitsHoldWhileWorkersRaceAndDie(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	ctx := context.Background()
	attemptLog(t, s.pool)
	const maxRunning, perTenant = 5, 2
	if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunning: maxRunning, MaxRunningPerTenant: perTenant}); err != nil {
		t.Fatal(err)
	}
	var batch []NewTask
	for i := range 120 {
		batch = append(batch, tenantTask(fmt.Sprintf("tenant-%d", i%4), fmt.Sprintf("limited-%d", i)))
	}
	if _, err := s.SubmitMany(ctx, batch); err != nil {
		t.Fatal(err)
	}
	var heldBack atomic.Int64
	cfg := WorkerConfig{Concurrency: 16, Lease: 2 * time.Second, Heartbeat: 400 * time.Millisecond,
		RescueInterval: 200 * time.Millisecond, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
		OnEvent: func(ev WorkerEvent) {
			if ev.Type == WorkerHeldBack {
				heldBack.Add(1)
			}
		},
		Handler: func(ctx context.Context, _ Task) Outcome {
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
			return Succeeded(json.RawMessage(`1`))
		}}
	// The doomed worker's handlers hang: it dies holding its attempts.
	doomed := cfg
	doomed.Handler = func(ctx context.Context, _ Task) Outcome { <-ctx.Done(); return Outcome{} }
	dw := newWorker(t, newStore(db.pool(t)), doomed)
	dw.test = &workerTestHooks{crashOnStop: true}
	kill := runWorker(t, dw)
	wait.For(t, patience, "the doomed worker holds attempts", func() bool { return dw.count() > 0 })
	kill()
	for range 3 {
		runWorker(t, newWorker(t, newStore(db.pool(t)), cfg))
	}
	wait.For(t, patience, "every task succeeded", func() bool {
		return countRows(t, s.pool, "state = 'succeeded'") == len(batch)
	})
	ivs := attemptIntervals(t, s.pool)
	if got := maxOverlap(ivs, ""); got > maxRunning || got < 2 {
		t.Fatalf("at most %d attempts held a lease at once; want ≤ MaxRunning %d (and some concurrency)", got, maxRunning)
	}
	for i := range 4 {
		if got := maxOverlap(ivs, fmt.Sprintf("tenant-%d", i)); got > perTenant {
			t.Fatalf("tenant-%d had %d attempts at once; want ≤ MaxRunningPerTenant %d", i, got, perTenant)
		}
	}
	if heldBack.Load() == 0 {
		t.Fatal("no claim reported a task held back by a limit")
	}
	t.Logf("%d attempts; at most %d at once; %d held-back events", len(ivs), maxOverlap(ivs, ""), heldBack.Load())
}

// Paused stops new attempts; a running one finishes; Submit still
// accepts; resuming runs the rest.
func TestPausedKindStartsNothingUntilResumed(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	release := make(chan struct{})
	var started atomic.Int64
	var heldBack atomic.Int64
	w := newWorker(t, s, WorkerConfig{Concurrency: 4,
		OnEvent: func(ev WorkerEvent) {
			if ev.Type == WorkerHeldBack && ev.Kind == "image" {
				heldBack.Add(1)
			}
		},
		Handler: func(ctx context.Context, task Task) Outcome {
			started.Add(1)
			if task.IdempotencyKey == "running" {
				<-release
			}
			return Succeeded(json.RawMessage(`1`))
		}})
	runWorker(t, w)
	running := mustSubmit(t, s, newTask("running"))
	waitState(t, s, running.ID, StateRunning)
	if err := s.SetKindLimits(ctx, "image", KindLimits{Paused: true}); err != nil {
		t.Fatal(err)
	}
	var waiting []Task
	for i := range 3 {
		waiting = append(waiting, mustSubmit(t, s, newTask(fmt.Sprintf("paused-%d", i))))
	}
	close(release)
	waitState(t, s, running.ID, StateSucceeded)
	wait.For(t, patience, "a claim held the paused kind back", func() bool { return heldBack.Load() >= 2 })
	for _, task := range waiting {
		if st := state(t, s, task.ID); st != StatePending {
			t.Fatalf("a task of the paused kind is %s; want pending", st)
		}
	}
	if n := started.Load(); n != 1 {
		t.Fatalf("%d handlers started; want only the one running before the pause", n)
	}
	if err := s.SetKindLimits(ctx, "image", KindLimits{}); err != nil {
		t.Fatal(err)
	}
	for _, task := range waiting {
		waitState(t, s, task.ID, StateSucceeded)
	}
}

// StartsPerSecond holds across workers: in any stretch of time, attempts
// started are at most the burst plus the rate times its length.
func TestStartsPerSecondHolds(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	ctx := context.Background()
	attemptLog(t, s.pool)
	const rate = 20.0
	if err := s.SetKindLimits(ctx, "image", KindLimits{StartsPerSecond: rate}); err != nil {
		t.Fatal(err)
	}
	var batch []NewTask
	for i := range 50 {
		batch = append(batch, newTask(fmt.Sprintf("rated-%d", i)))
	}
	if _, err := s.SubmitMany(ctx, batch); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		runWorker(t, newWorker(t, newStore(db.pool(t)), WorkerConfig{Concurrency: 16, PollInterval: 10 * time.Millisecond,
			Handler: func(context.Context, Task) Outcome { return Succeeded(json.RawMessage(`1`)) }}))
	}
	wait.For(t, patience, "every task succeeded", func() bool {
		return countRows(t, s.pool, "state = 'succeeded'") == len(batch)
	})
	ivs := attemptIntervals(t, s.pool)
	starts := make([]time.Time, len(ivs))
	for i, iv := range ivs {
		starts[i] = iv.claimed
	}
	slices.SortFunc(starts, time.Time.Compare)
	// Times are the claims' statement starts, the bucket's own clock.
	const slop = 1e-9
	for i := range starts {
		for j := i; j < len(starts); j++ {
			allowed := rate + rate*starts[j].Sub(starts[i]).Seconds() + slop
			if n := float64(j - i + 1); n > allowed {
				t.Fatalf("%v starts within %v; want ≤ %v (burst %v + %v/s)", n, starts[j].Sub(starts[i]), allowed, rate, rate)
			}
		}
	}
	if took := starts[len(starts)-1].Sub(starts[0]); took < time.Second {
		t.Fatalf("50 starts at %v/s took %v; want at least (50 − burst)/rate", rate, took)
	}
}

// Reconcile calls count against MaxRunning like attempts: with running
// attempts and due reconciles of one kind on two workers, no more than
// MaxRunning of either run at once.
func TestKindLimitsCountReconcileCalls(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	ctx := context.Background()
	const maxRunning = 2
	if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunning: maxRunning}); err != nil {
		t.Fatal(err)
	}
	var batch []NewTask
	for i := range 40 {
		batch = append(batch, newTask(fmt.Sprintf("reconciled-%d", i)))
	}
	if _, err := s.SubmitMany(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'uncertain', attempt = 1
		WHERE idempotency_key LIKE 'reconciled-%' AND right(idempotency_key, 1) IN ('0', '2', '4', '6', '8')`); err != nil {
		t.Fatal(err)
	}
	var running, most atomic.Int64
	run := func(context.Context, Task) Outcome {
		n := running.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(10 * time.Millisecond)
		running.Add(-1)
		return Succeeded(json.RawMessage(`1`))
	}
	for range 2 {
		runWorker(t, newWorker(t, newStore(db.pool(t)), WorkerConfig{Concurrency: 8, Handler: run, Reconcile: run,
			RescueInterval: 20 * time.Millisecond}))
	}
	wait.For(t, patience, "every task succeeded", func() bool {
		return countRows(t, s.pool, "state = 'succeeded'") == len(batch)
	})
	if m := most.Load(); m > maxRunning {
		t.Fatalf("%d handlers and Reconciles ran at once; want ≤ MaxRunning %d", m, maxRunning)
	}
}

// A StartsPerSecond above MaxStartsPerSecond is refused (once accepted,
// its bucket held more than 2^31 tokens and every claim failed casting
// them to int), and the table refuses it too; at the bound, claims of
// the kind and of every other kind go on.
func TestHugeStartsPerSecondDoesNotBreakClaims(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	for _, rate := range []float64{MaxStartsPerSecond * 1.01, 3e9, 1e300} {
		if err := s.SetKindLimits(ctx, "image", KindLimits{StartsPerSecond: rate}); err == nil {
			t.Errorf("SetKindLimits(StartsPerSecond %v): no error; at most %v", rate, float64(MaxStartsPerSecond))
		}
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_kind_limits (kind, starts_per_second) VALUES ('video', 3e9)`); err == nil {
		t.Error("the table took a rate of 3e9 a second")
	}
	for _, rate := range []float64{MaxStartsPerSecond} {
		if err := s.SetKindLimits(ctx, "image", KindLimits{StartsPerSecond: rate}); err != nil {
			t.Fatal(err)
		}
		mustSubmit(t, s, newTask("huge-rate"))
		// Another kind claimed by the same any-kind worker suffers too.
		other := newTask("other-kind")
		other.Kind = "audio"
		mustSubmit(t, s, other)
		w := newWorker(t, s, WorkerConfig{Handler: func(context.Context, Task) Outcome { return Outcome{} }})
		sql, args := w.claimStatement(4)
		got, err := w.runClaim(ctx, sql, args)
		if err != nil {
			t.Errorf("rate %v: the claim of every kind fails: %v", rate, err)
			continue
		}
		if len(got) != 2 {
			t.Errorf("rate %v: claimed %d tasks; want 2", rate, len(got))
		}
	}
}

// An operator (or a script) flips a kind between paused and MaxRunning 2
// while four workers on separate pools claim. Nothing runs while paused,
// and at most 2 run otherwise, so no instant may see more than 2
// attempts. A paused-only row once took no advisory lock, and a claim
// whose snapshot read MaxRunning 2 committed after the lock statement
// counted room beside another (4 leases at once).
func TestLimitsHoldWhilePauseFlipsToMaxRunning(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	ctx := context.Background()
	attemptLog(t, s.pool)
	const maxRunning = 2
	if err := s.SetKindLimits(ctx, "image", KindLimits{Paused: true}); err != nil {
		t.Fatal(err)
	}
	var batch []NewTask
	for i := range 400 {
		batch = append(batch, tenantTask(fmt.Sprintf("t-%d", i%7), fmt.Sprintf("flip-%d", i)))
	}
	if _, err := s.SubmitMany(ctx, batch); err != nil {
		t.Fatal(err)
	}
	var live, most atomic.Int64
	cfg := WorkerConfig{Concurrency: 8, PollInterval: 5 * time.Millisecond,
		Handler: func(context.Context, Task) Outcome {
			n := live.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(3 * time.Millisecond)
			live.Add(-1)
			return Succeeded(json.RawMessage(`1`))
		}}
	for range 4 {
		runWorker(t, newWorker(t, newStore(db.pool(t)), cfg))
	}
	stop := make(chan struct{})
	flips := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				flips <- n
				return
			default:
			}
			l := KindLimits{Paused: true}
			if n%2 == 0 {
				l = KindLimits{MaxRunning: maxRunning}
			}
			if err := s.SetKindLimits(ctx, "image", l); err != nil {
				t.Error(err)
			}
			n++
			time.Sleep(time.Duration(n%4) * time.Millisecond)
		}
	}()
	ok := wait.Until(3*patience, func() bool { return countRows(t, s.pool, "state = 'succeeded'") >= 300 })
	close(stop)
	n := <-flips
	ivs := attemptIntervals(t, s.pool)
	t.Logf("%d flips, %d attempts, at most %d leases at once (db), %d handlers at once", n, len(ivs), maxOverlap(ivs, ""), most.Load())
	if !ok {
		t.Fatalf("only %d of 400 succeeded in 90s", countRows(t, s.pool, "state = 'succeeded'"))
	}
	if got := maxOverlap(ivs, ""); got > maxRunning {
		t.Fatalf("%d attempts held a lease at once; MaxRunning is %d and paused means none start", got, maxRunning)
	}
	if m := most.Load(); m > maxRunning {
		t.Fatalf("%d handlers ran at once; want ≤ %d", m, maxRunning)
	}
}

// MaxRunningPerTenant must hold a tenant back, not the kind: while tenant
// A's high-priority backlog waits on A's per-tenant limit, free slots go
// to tenant B's lower-priority tasks (B is within its own limit). A's
// backlog once filled the claim's window of @limit candidates, and B was
// never looked at.
func TestPerTenantLimitDoesNotBlockOtherTenants(t *testing.T) {
	t.Parallel()
	for _, shape := range claimShapes[:2] {
		t.Run(shape.name, func(t *testing.T) {
			t.Parallel()
			s, _ := setup(t)
			ctx := context.Background()
			const perTenant = 2
			if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunningPerTenant: perTenant}); err != nil {
				t.Fatal(err)
			}
			var batch []NewTask
			for i := range 50 {
				nt := tenantTask("tenant-a", fmt.Sprintf("a-%d", i))
				nt.Priority = 5
				batch = append(batch, nt)
			}
			for i := range 5 {
				batch = append(batch, tenantTask("tenant-b", fmt.Sprintf("b-%d", i)))
			}
			if _, err := s.SubmitMany(ctx, batch); err != nil {
				t.Fatal(err)
			}
			got := claimNow(t, s, shape.kinds, 8)
			byTenant := map[string]int{}
			for _, task := range got {
				byTenant[task.Tenant]++
			}
			if byTenant["tenant-a"] > perTenant {
				t.Fatalf("tenant-a got %d attempts; limit %d", byTenant["tenant-a"], perTenant)
			}
			// Then again, with A at its limit: only B can start.
			more := claimNow(t, s, shape.kinds, 8)
			for _, task := range more {
				byTenant[task.Tenant]++
			}
			if byTenant["tenant-b"] != perTenant {
				t.Fatalf("8 free slots, twice: claimed %v; want tenant-b's %d tasks started too (it is within its limit)",
					byTenant, perTenant)
			}
		})
	}
}

// Paused holds back every start of a handler of the kind: a first
// attempt, a due retry and a due Reconcile; Submit still accepts. Resume
// wakes the workers by notification, not at their next poll (10 s here).
func TestPauseHoldsRetriesAndReconcilesResumeWakesPromptly(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	if err := s.SetKindLimits(ctx, "image", KindLimits{Paused: true}); err != nil {
		t.Fatal(err)
	}
	fresh := mustSubmit(t, s, newTask("fresh"))
	retry := mustSubmit(t, s, newTask("retry"))
	unc := mustSubmit(t, s, newTask("uncertain"))
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'retrying', attempt = 1, tries = 1
		WHERE id = $1::uuid`, retry.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'uncertain', attempt = 1, tries = 1
		WHERE id = $1::uuid`, unc.ID); err != nil {
		t.Fatal(err)
	}
	var starts atomic.Int64
	h := func(context.Context, Task) Outcome { starts.Add(1); return Succeeded(json.RawMessage(`1`)) }
	w := newWorker(t, s, WorkerConfig{Concurrency: 4, Handler: h, Reconcile: h,
		PollInterval: time.Hour, RescueInterval: 50 * time.Millisecond})
	runWorker(t, w)
	time.Sleep(time.Second)
	if n := starts.Load(); n != 0 {
		t.Fatalf("%d handlers or Reconciles started while paused", n)
	}
	if _, err := s.Submit(ctx, newTask("while-paused")); err != nil {
		t.Fatalf("Submit while paused: %v", err)
	}
	if err := s.SetKindLimits(ctx, "image", KindLimits{}); err != nil {
		t.Fatal(err)
	}
	// The poll interval is longer than patience: only the resume's
	// notification can wake the worker in time, however slow the machine.
	for _, id := range []string{fresh.ID, retry.ID, unc.ID} {
		waitState(t, s, id, StateSucceeded)
	}
}

// A fractional rate (0.1/s) has a burst of one start; setting the limits
// again (the same rate, a pause and resume, another MaxRunning) gives no
// extra tokens; a raised rate fills at the new rate, from what is left.
func TestFractionalRateAndMidBucketChanges(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	for i := range 20 {
		mustSubmit(t, s, tenantTask(fmt.Sprintf("t%d", i%3), fmt.Sprintf("rate-%d", i)))
	}
	set := func(l KindLimits) {
		t.Helper()
		if err := s.SetKindLimits(ctx, "image", l); err != nil {
			t.Fatal(err)
		}
	}
	claim := func() int { return len(claimNow(t, s, []string{"image"}, 10)) }
	set(KindLimits{StartsPerSecond: 0.1})
	if n := claim(); n != 1 {
		t.Fatalf("first claim at 0.1/s: %d starts; want the burst of 1", n)
	}
	for _, l := range []KindLimits{{StartsPerSecond: 0.1}, {StartsPerSecond: 0.1, Paused: true},
		{StartsPerSecond: 0.1}, {StartsPerSecond: 0.1, MaxRunning: 100}, {StartsPerSecond: 0.1, MaxRunningPerTenant: 5}} {
		set(l)
		if n := claim(); n != 0 {
			t.Fatalf("after SetKindLimits(%+v): %d starts; the bucket was empty", l, n)
		}
	}
	set(KindLimits{StartsPerSecond: 4})
	if n := claim(); n != 0 {
		t.Fatalf("raised to 4/s from an empty bucket: %d starts at once; want none yet", n)
	}
	time.Sleep(600 * time.Millisecond)
	if n := claim(); n < 2 || n > 3 {
		t.Fatalf("600ms at 4/s: %d starts; want 2", n)
	}
	time.Sleep(3 * time.Second)
	if n := claim(); n != 4 {
		t.Fatalf("3s idle at 4/s: %d starts; want the burst of 4", n)
	}
}

// MaxRunning holds across timeouts when handlers honour their context,
// as KindLimits assume: an attempt past its kind's Timeout ends before
// the next one starts. (A handler that ignores its context runs on after
// its attempt was written off, uncounted: documented in KindLimits and
// docs/queue.md.)
func TestMaxRunningHoldsPastTimeoutWhenHandlersHonourTheirContext(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	ctx := context.Background()
	if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunning: 1}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		mustSubmit(t, s, newTask(fmt.Sprintf("hung-%d", i)))
	}
	var live, most, starts atomic.Int64
	h := func(ctx context.Context, _ Task) Outcome {
		starts.Add(1)
		n := live.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		select { // honours ctx, as KindLimits assume
		case <-ctx.Done():
		case <-time.After(1500 * time.Millisecond):
		}
		live.Add(-1)
		return Outcome{}
	}
	for range 2 {
		runWorker(t, newWorker(t, newStore(db.pool(t)), WorkerConfig{Concurrency: 2, Handler: h,
			Heartbeat: 100 * time.Millisecond, Policies: map[string]KindPolicy{"image": {Timeout: 300 * time.Millisecond}}}))
	}
	wait.For(t, patience, "attempts past their timeout, retried", func() bool { return starts.Load() >= 5 })
	if m := most.Load(); m > 1 {
		t.Fatalf("%d handlers of the kind ran at once; MaxRunning is 1", m)
	}
}

// Operators changing one kind at once each change only what they name:
// concurrent UpdateKindLimits calls, each owning one field of a kind and
// setting it again and again, leave every field at its owner's last
// value, on a kind whose row each may be the first to add. An invalid
// result changes nothing.
func TestUpdateKindLimitsLosesNoConcurrentChange(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	const rounds = 40
	setters := []func(l *KindLimits, i int){
		func(l *KindLimits, i int) { l.Paused = i%2 == 0 },
		func(l *KindLimits, i int) { l.MaxRunning = i + 1 },
		func(l *KindLimits, i int) { l.MaxRunningPerTenant = 100 + i },
		func(l *KindLimits, i int) { l.StartsPerSecond = float64(i) + 0.5 },
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, set := range setters {
		wg.Go(func() {
			<-start
			for i := range rounds {
				if _, err := s.UpdateKindLimits(ctx, "image", func(l KindLimits) KindLimits { set(&l, i); return l }); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	var want KindLimits
	for _, set := range setters {
		set(&want, rounds-1)
	}
	if got, err := s.KindLimits(ctx, "image"); err != nil || got != want {
		t.Fatalf("limits after concurrent updates = %+v, %v; want %+v (each field its owner's last value)", got, err, want)
	}
	if _, err := s.UpdateKindLimits(ctx, "image", func(l KindLimits) KindLimits { l.MaxRunning = -1; return l }); err == nil {
		t.Error("UpdateKindLimits to MaxRunning -1: no error")
	}
	if _, err := s.UpdateKindLimits(ctx, "new-kind", func(KindLimits) KindLimits { return KindLimits{StartsPerSecond: math.NaN()} }); err == nil {
		t.Error("UpdateKindLimits to a NaN rate: no error")
	}
	if got, _ := s.KindLimits(ctx, "image"); got != want {
		t.Errorf("a refused update changed the limits to %+v", got)
	}
	var n int
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM idemgate_kind_limits WHERE kind = 'new-kind'").Scan(&n); err != nil || n != 0 {
		t.Errorf("a refused update of a new kind left %d rows (%v)", n, err)
	}
	got, err := s.UpdateKindLimits(ctx, "image", func(l KindLimits) KindLimits { l.Paused = true; return l })
	if want.Paused = true; err != nil || got != want {
		t.Errorf("UpdateKindLimits returned %+v, %v; want %+v", got, err, want)
	}
}

// MaxRunningPerTenant skips a capped tenant without reading its backlog:
// with every tenant of the kind at its limit, a claim (which takes
// nothing) reads as much beside 100 tenants × 100 waiting tasks as
// beside 100 × 10, and so does the claim of a free tenant's task whose
// turn lies behind the capped tenants' backlog. The claim read every
// capped tenant's waiting task (2.6 s and 354,569 buffers at 1,000 × 50),
// under the kind's lock, at every poll of every worker of the kind.
func TestClaimSkipsCappedTenantsWithoutReadingTheirBacklog(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunningPerTenant: 1}); err != nil {
		t.Fatal(err)
	}
	const tenants = 100
	cappedBacklog(t, s, tenants, 0, 10)
	noneSmall := claimPlan(t, s, []string{"image"}, 4)
	cappedBacklog(t, s, tenants, 10, 90)
	noneBig := claimPlan(t, s, []string{"image"}, 4)
	// A free tenant's task at the last turn of the backlog (its tenant's
	// earlier tasks have run). "a-free" sorts before every "capped-…".
	free := mustSubmit(t, s, tenantTask("a-free", "free"))
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET turn = 99 WHERE id = $1::uuid`, free.ID); err != nil {
		t.Fatal(err)
	}
	freeBig := claimPlan(t, s, []string{"image"}, 4)
	t.Logf("claim beside %d capped tenants: %+v at 10 waiting each, %+v at 100; of a free tenant's task at turn 99: %+v",
		tenants, noneSmall, noneBig, freeBig)
	if noneSmall.Rows != 0 || noneBig.Rows != 0 || freeBig.Rows != 1 {
		t.Fatalf("claims returned %d, %d and %d rows; want none, none and the free tenant's task",
			noneSmall.Rows, noneBig.Rows, freeBig.Rows)
	}
	for _, got := range []planFigures{noneBig, freeBig} {
		if got.Buffers > noneSmall.Buffers+noneSmall.Buffers/2+50 {
			t.Fatalf("a claim read %d buffers beside 100 waiting tasks of each capped tenant, %d beside 10: "+
				"it reads the capped tenants' backlog", got.Buffers, noneSmall.Buffers)
		}
	}
	if got := claimNow(t, s, []string{"image"}, 4); len(got) != 1 || got[0].ID != free.ID {
		t.Fatalf("claimed %v; want the free tenant's task alone", keysOf(got))
	}
}

// A worker whose Kinds names a kind twice (a careless configuration)
// claims each task once and keeps the kind's limits: each name reads the
// kind's candidates again, in the same statement.
func TestKindNamedTwiceClaimsEachTaskOnce(t *testing.T) {
	t.Parallel()
	for _, l := range []KindLimits{{}, {MaxRunning: 3}, {MaxRunningPerTenant: 1}} {
		t.Run(fmt.Sprintf("%+v", l), func(t *testing.T) {
			t.Parallel()
			s, _ := setup(t)
			ctx := context.Background()
			if err := s.SetKindLimits(ctx, "image", l); err != nil {
				t.Fatal(err)
			}
			want := 6
			switch {
			case l.MaxRunning > 0:
				want = l.MaxRunning
			case l.MaxRunningPerTenant > 0:
				want = 3 // three tenants
			}
			for i := range 6 {
				mustSubmit(t, s, tenantTask(fmt.Sprintf("t-%d", i%3), fmt.Sprintf("k-%d", i)))
			}
			got := claimNow(t, s, []string{"image", "image"}, 16)
			ids := map[string]bool{}
			for _, c := range got {
				ids[c.ID] = true
			}
			if len(got) != want || len(ids) != want {
				t.Fatalf("claimed %d tasks (%d distinct); want %d", len(got), len(ids), want)
			}
		})
	}
}
