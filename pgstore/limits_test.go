package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
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
	at timestamptz DEFAULT clock_timestamp(), stmt timestamptz DEFAULT statement_timestamp());
CREATE FUNCTION idemgate_test_log_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO idemgate_test_attempts (id, attempt, tenant, state, lease_until)
	VALUES (NEW.id, NEW.attempt, NEW.tenant, NEW.state, NEW.lease_until);
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
