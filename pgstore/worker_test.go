package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/internal/wait"
)

// runWorker starts w and returns a stop function that cancels it and
// waits for Run to return; the test's cleanup stops it too.
func runWorker(t testing.TB, w *Worker) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func newWorker(t testing.TB, s *Store, cfg WorkerConfig) *Worker {
	t.Helper()
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 50 * time.Millisecond
	}
	w, err := NewWorker(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// calls counts handler invocations by task ID.
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *calls) add(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[id]++
	return c.n[id]
}

func (c *calls) get(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

// state reads a task's state straight from the table.
func state(t testing.TB, s *Store, id string) State {
	t.Helper()
	var st State
	if err := s.pool.QueryRow(context.Background(), "SELECT state FROM idemgate_tasks WHERE id = $1::uuid", id).Scan(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

func waitState(t testing.TB, s *Store, id string, want State) {
	t.Helper()
	if !wait.Until(patience, func() bool { return state(t, s, id) == want }) {
		t.Fatalf("task %s is %s; want %s", id, state(t, s, id), want)
	}
}

// waitEntered waits until entered is closed by a handler; if none runs
// within patience, it fails with the tasks' rows and the waiting lines,
// to tell a claim that misses a task from a worker that does not claim.
func waitEntered(t testing.TB, s *Store, entered <-chan struct{}) {
	t.Helper()
	select {
	case <-entered:
		return
	case <-time.After(patience):
	}
	ctx := context.Background()
	var dump []string
	for _, q := range []string{
		`SELECT format('task %s kind %s tenant %s state %s priority %s turn %s run_after %s (now %s) attempt %s', id, kind, tenant, state, priority, turn, run_after, now(), attempt) FROM idemgate_tasks`,
		`SELECT format('line %s', w) FROM idemgate_waiting_tenants w`,
		`SELECT format('backend %s %s %s', pid, state, left(query, 60)) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`,
	} {
		rows, err := s.pool.Query(ctx, q)
		if err != nil {
			dump = append(dump, err.Error())
			continue
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			got = append(got, err.Error())
		}
		dump = append(dump, got...)
	}
	t.Fatalf("no handler ran within %v:\n%s", patience, strings.Join(dump, "\n"))
}

func mustSubmit(t testing.TB, s *Store, nt NewTask) Task {
	t.Helper()
	got, err := s.Submit(context.Background(), nt)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestWorkersRunEachTaskOnce(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	const total = 5000
	var (
		running sync.Map
		overlap atomic.Int64
		c       calls
	)
	handler := func(ctx context.Context, task Task) Outcome {
		if _, busy := running.LoadOrStore(task.ID, true); busy {
			overlap.Add(1)
		}
		c.add(task.ID)
		running.Delete(task.ID)
		return Succeeded(json.RawMessage(`{"ok":true}`))
	}
	for p := range 2 {
		ps := newStore(db.pool(t))
		for i := range 2 {
			runWorker(t, newWorker(t, ps, WorkerConfig{Handler: handler, Name: fmt.Sprintf("w%d%d", p, i), Concurrency: 16}))
		}
	}
	for b := range 5 {
		if _, err := s.pool.Exec(context.Background(), `INSERT INTO idemgate_tasks
			(tenant, owner, kind, runtime, network, idempotency_key, fingerprint)
			SELECT 'acme', 'o', 'image', 'gpu', 'main', 'bulk-' || $1::int || '-' || g, 'f'
			FROM generate_series(1, $2::int) g`, b, total/5); err != nil {
			t.Fatal(err)
		}
	}
	// 5000 tasks: on a loaded machine this takes longer than patience.
	wait.For(t, 4*patience, "every task succeeded", func() bool { return countRows(t, s.pool, "state = 'succeeded'") == total })
	if n := overlap.Load(); n != 0 {
		t.Errorf("%d times a task was running twice at once", n)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.n) != total {
		t.Errorf("handler saw %d tasks; want %d", len(c.n), total)
	}
	for id, n := range c.n {
		if n != 1 {
			t.Errorf("handler ran %d times for %s", n, id)
		}
	}
	if n := countRows(t, s.pool, "attempt <> 1"); n != 0 {
		t.Errorf("%d tasks were claimed more than once", n)
	}
}

func TestKilledWorkerIsRescuedAndItsCompletionRejected(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	task := mustSubmit(t, s, newTask("killed"))
	var (
		c        calls
		entered  = make(chan struct{})
		unblock  = make(chan struct{})
		rejected = make(chan Outcome, 1)
	)
	handler := func(ctx context.Context, t Task) Outcome {
		if c.add(t.ID) == 1 {
			close(entered)
			<-unblock // hung: ignores its context
			return Succeeded(json.RawMessage(`"stale"`))
		}
		return Succeeded(json.RawMessage(`"second"`))
	}
	// 2 s: a's handler must start within its lease on a loaded machine.
	cfg := WorkerConfig{Handler: handler, Lease: 2 * time.Second, Heartbeat: 200 * time.Millisecond,
		RescueInterval: 50 * time.Millisecond, BackoffBase: time.Millisecond}
	a := newWorker(t, s, cfg)
	a.test = &workerTestHooks{crashOnStop: true, onFinish: func(_ Task, o Outcome, applied bool, _ error) {
		if !applied {
			rejected <- o
		}
	}}
	stopA := runWorker(t, a)
	waitEntered(t, s, entered)
	stopA() // dies: no more heartbeats, no release

	// b's own attempt has a long lease: with a's short one (then 500 ms),
	// a heartbeat late on a loaded machine let b's attempt be rescued
	// too, and the task ended at attempt 3.
	cfgB := cfg
	cfgB.Lease, cfgB.Heartbeat = time.Minute, time.Second
	b := newWorker(t, s, cfgB)
	runWorker(t, b)
	waitState(t, s, task.ID, StateSucceeded)
	close(unblock)
	select {
	case <-rejected:
	case <-time.After(30 * time.Second):
		t.Fatal("the stale completion was neither applied nor rejected")
	}
	got, err := s.Get(context.Background(), task.Tenant, task.Owner, task.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != StateSucceeded || got.Attempt != 2 || len(got.Results) != 1 || string(got.Results[0]) != `"second"` {
		t.Fatalf("got state %s attempt %d results %s; want the second attempt's success", got.State, got.Attempt, got.Results)
	}
	if n := c.get(task.ID); n != 2 {
		t.Fatalf("handler ran %d times; want 2", n)
	}
}

// TestFailedOutcomeWriteIsRetried: the write of an outcome fails for
// longer than a lease (the database restarting); the worker retries it
// while its heartbeat keeps the lease, so the task is not rescued and
// its handler runs once.
func TestFailedOutcomeWriteIsRetried(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	task := mustSubmit(t, s, newTask("write-fails"))
	var (
		c          calls
		tries      atomic.Int64
		firstLease time.Time // lease_until when the write first failed
	)
	// 100 ms beats kept a 2 s lease until a run beside another full
	// pgstore suite stalled them longer, and a 4 s one until a run beside
	// the suite and 4 busy loops (load ~20): no beat landed for 3.6 s and
	// the handler ran twice. Beats with a second of room each keep 6 s.
	cfg := WorkerConfig{Lease: 6 * time.Second, Heartbeat: beatUnderLoad,
		RescueInterval: 20 * time.Millisecond, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
		Handler: func(ctx context.Context, t Task) Outcome {
			c.add(t.ID)
			return Succeeded(json.RawMessage(`"once"`))
		}}
	w := newWorker(t, s, cfg)
	// The writes fail until that lease has run out, by the database's
	// clock: only heartbeats can have kept the task from the rescuer.
	w.test = &workerTestHooks{failWrite: func(t Task, try int) error {
		tries.Add(1)
		ctx := context.Background()
		if try == 1 {
			if err := s.pool.QueryRow(ctx, "SELECT lease_until FROM idemgate_tasks WHERE id = $1::uuid", t.ID).Scan(&firstLease); err != nil {
				return err
			}
		}
		var over bool
		if err := s.pool.QueryRow(ctx, "SELECT now() > $1::timestamptz + interval '100 milliseconds'", firstLease).Scan(&over); err != nil || !over {
			return errors.New("conn closed: the database is restarting")
		}
		return nil
	}}
	runWorker(t, w)
	wait.For(t, patience, "the worker holds the task", func() bool { return c.get(task.ID) == 1 }) // w holds the task
	runWorker(t, newWorker(t, s, cfg))                                                             // would run a rescued task at once
	waitState(t, s, task.ID, StateSucceeded)
	got := mustGet(t, s, task)
	if n := c.get(task.ID); n != 1 || got.Attempt != 1 {
		t.Fatalf("handler ran %d times, attempt %d; want once", n, got.Attempt)
	}
	if n := tries.Load(); n < 3 {
		t.Fatalf("the write was tried %d times; want it failed and retried", n)
	}
	if p := Project(got); p.State != StateSucceeded || string(p.Results[0]) != `"once"` {
		t.Fatalf("projection %+v; want the one success", p)
	}
}

// beatUnderLoad is the Heartbeat of tests whose beats must land on a
// loaded machine: to keep a lease, or to see that another attempt took
// the task while the worker's own lease (an hour) still runs, which only
// a heartbeat sees. Each beat waits at most Heartbeat for the database.
// At 20 ms, beats on a loaded machine timed out one after another
// (dozens in a row at load 10–15 on 2 cores; a timed-out query costs its
// connection, so the next beat dials too), and in CI, at load 19,
// TestOutcomeWriteRetriesStopWhenTheLeaseIsLost gave up after 30 s with
// the loss unseen. A second is room for a beat there.
const beatUnderLoad = time.Second

// TestOutcomeWriteRetriesStopWhenTheLeaseIsLost: a write that keeps
// failing is retried only while the attempt holds its lease.
func TestOutcomeWriteRetriesStopWhenTheLeaseIsLost(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	task := mustSubmit(t, s, newTask("write-never-lands"))
	returned, finished := make(chan struct{}), make(chan error, 1)
	w := newWorker(t, s, WorkerConfig{Lease: time.Hour, Heartbeat: beatUnderLoad,
		Handler: func(ctx context.Context, t Task) Outcome {
			defer close(returned)
			return Succeeded(json.RawMessage(`1`))
		}})
	w.test = &workerTestHooks{
		failWrite: func(Task, int) error { return errors.New("conn closed") },
		onFinish:  func(_ Task, _ Outcome, _ bool, err error) { finished <- err },
	}
	runWorker(t, w)
	waitEntered(t, s, returned)
	if _, err := s.pool.Exec(context.Background(), "UPDATE idemgate_tasks SET attempt = attempt + 1 WHERE id = $1::uuid", task.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-finished:
		if err == nil {
			t.Fatal("the write reported success although it always failed")
		}
	case <-time.After(patience):
		t.Fatal("the write was still retried after the lease was lost")
	}
	if n := w.count(); n != 0 {
		t.Fatalf("%d slots still taken; want the attempt's freed", n)
	}
}

// Outcome writes that keep failing: the outcomes waiting for their write
// stay within maxWritingPerSlot per slot (no claim past them), and at
// shutdown the tasks whose outcome never landed are released for another
// worker, not left running until their lease runs out.
func TestShutdownReleasesOutcomesThatCouldNotBeWritten(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	const concurrency, tasks = 2, 40
	batch := make([]NewTask, tasks)
	for i := range batch {
		batch[i] = newTask(fmt.Sprint("unwritten-", i))
	}
	if _, err := s.SubmitMany(ctx, batch); err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int64
	w := newWorker(t, s, WorkerConfig{Concurrency: concurrency, ShutdownTimeout: 100 * time.Millisecond,
		Handler: func(context.Context, Task) Outcome {
			ran.Add(1)
			return Succeeded(json.RawMessage(`1`))
		}})
	w.test = &workerTestHooks{failWrite: func(Task, int) error { return errors.New("conn closed") }}
	stop := runWorker(t, w)
	const most = (1 + maxWritingPerSlot) * concurrency
	wait.For(t, patience, "the held outcomes reached their bound", func() bool { return ran.Load() == most })
	stop()
	if n := ran.Load(); n != most {
		t.Errorf("%d handlers ran while no outcome could be written; want %d", n, most)
	}
	if n := countRows(t, s.pool, "state = 'running'"); n != 0 {
		t.Errorf("%d tasks left running after Run returned; want those whose outcome never landed released", n)
	}
	if n := countRows(t, s.pool, "state = 'retrying' AND attempt = 1"); n != most {
		t.Errorf("%d tasks released; want %d", n, most)
	}
}

// TestNoClaimAfterCancel: once Run's context has ended, the worker claims
// nothing more, not even a task it could run at once.
func TestNoClaimAfterCancel(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	task := mustSubmit(t, s, newTask("after-cancel"))
	w := newWorker(t, s, WorkerConfig{Handler: func(context.Context, Task) Outcome {
		return Succeeded(json.RawMessage(`1`))
	}})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if n := w.claims.Load(); n != 0 {
		t.Fatalf("%d claims after the context ended; want none", n)
	}
	if st := state(t, s, task.ID); st != StatePending {
		t.Fatalf("task is %s; want pending", st)
	}
}

func TestStaleTransitionsAreFenced(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	task := mustSubmit(t, s, newTask("fenced"))
	w := newWorker(t, s, WorkerConfig{Handler: func(context.Context, Task) Outcome { return Outcome{} }, Lease: time.Hour})
	claimed, _, _, err := w.claim(ctx, 10)
	if err != nil || len(claimed) != 1 || claimed[0].Attempt != 1 {
		t.Fatalf("claim = %+v, %v; want attempt 1 of the task", claimed, err)
	}
	// A newer attempt took the task over.
	if _, err := s.pool.Exec(ctx, "UPDATE idemgate_tasks SET attempt = 2 WHERE id = $1::uuid", task.ID); err != nil {
		t.Fatal(err)
	}
	for _, o := range []Outcome{Succeeded(json.RawMessage(`1`)), Failed(errors.New("x")), Retry(0, errors.New("x")), Uncertain(errors.New("x")), {}} {
		tr := decide(verdict{from: StateRunning, returned: true, outcome: o})
		_, applied, err := w.completer.write(ctx, claimed[0], StateRunning, tr)
		if err != nil || applied {
			t.Fatalf("stale finish %+v = %v, %v; want rejected", o, applied, err)
		}
	}
	if _, err := s.pool.Exec(ctx, sqlRelease, pgx.NamedArgs{"id": task.ID, "attempt": 1, "max_attempts": 5, "reconcile_us": 1}); err != nil {
		t.Fatal(err)
	}
	got, _ := s.Get(ctx, task.Tenant, task.Owner, task.ID)
	if got.State != StateRunning || got.Attempt != 2 || len(got.Results) != 0 {
		t.Fatalf("a stale attempt changed the task: %+v", got)
	}
}

func TestLostLeaseCancelsTheHandler(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	task := mustSubmit(t, s, newTask("stolen"))
	cause := make(chan error, 1)
	var entered = make(chan struct{})
	w := newWorker(t, s, WorkerConfig{Lease: time.Hour, Heartbeat: beatUnderLoad,
		Handler: func(ctx context.Context, t Task) Outcome {
			close(entered)
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return Succeeded(json.RawMessage(`"late"`))
		}})
	runWorker(t, w)
	waitEntered(t, s, entered)
	if _, err := s.pool.Exec(context.Background(), "UPDATE idemgate_tasks SET attempt = attempt + 1 WHERE id = $1::uuid", task.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-cause:
		if !errors.Is(err, errLeaseLost) {
			t.Fatalf("handler canceled by %v; want errLeaseLost", err)
		}
	case <-time.After(patience):
		t.Fatal("handler not canceled after its lease was taken")
	}
	if st := state(t, s, task.ID); st != StateRunning {
		t.Fatalf("state = %s; the late outcome must not apply", st)
	}
}

func TestHeartbeatKeepsTheLease(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	task := mustSubmit(t, s, newTask("long"))
	entered, unblock := make(chan struct{}), make(chan struct{})
	// A lease a loaded machine's heartbeats keep (each may take up to
	// Heartbeat), short enough to outlive it several times.
	const lease = 3 * time.Second
	cfg := WorkerConfig{Lease: lease, Heartbeat: lease / 6, RescueInterval: time.Hour,
		Handler: func(ctx context.Context, t Task) Outcome {
			close(entered)
			<-unblock
			return Succeeded(json.RawMessage(`"done"`))
		}}
	w := newWorker(t, s, cfg)
	runWorker(t, w)
	waitEntered(t, s, entered)
	var first time.Time
	if err := s.pool.QueryRow(context.Background(), "SELECT lease_until FROM idemgate_tasks WHERE id = $1::uuid", task.ID).Scan(&first); err != nil {
		t.Fatal(err)
	}
	// Outlive the first lease by a wide margin, watching it move.
	wait.For(t, patience, "the first lease has long expired", func() bool {
		var expiredOnce bool
		err := s.pool.QueryRow(context.Background(), "SELECT now() > $2::timestamptz + $3::bigint * interval '1 microsecond' FROM idemgate_tasks WHERE id = $1::uuid",
			task.ID, first, lease.Microseconds()).Scan(&expiredOnce)
		return err == nil && expiredOnce
	})
	rescuer := newWorker(t, s, cfg)
	if n, err := rescuer.rescuer.rescue(context.Background()); err != nil || n != 0 {
		t.Fatalf("rescue = %d, %v; want nothing to rescue while heartbeats run", n, err)
	}
	close(unblock)
	waitState(t, s, task.ID, StateSucceeded)
}

func TestRescueBacksOffThenFails(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	w := newWorker(t, s, WorkerConfig{Handler: func(context.Context, Task) Outcome { return Outcome{} },
		MaxAttempts: 4, BackoffBase: time.Hour, BackoffMax: 3 * time.Hour})
	tests := []struct {
		name      string
		tries     int
		wantState State
		wantMin   time.Duration // delay window, jitter included
		wantMax   time.Duration
	}{
		{name: "first expiry waits the base", tries: 1, wantState: StateRetrying, wantMin: 30 * time.Minute, wantMax: time.Hour},
		{name: "second expiry doubles it", tries: 2, wantState: StateRetrying, wantMin: time.Hour, wantMax: 2 * time.Hour},
		{name: "the cap holds", tries: 3, wantState: StateRetrying, wantMin: 90 * time.Minute, wantMax: 3 * time.Hour},
		{name: "the last attempt fails", tries: 4, wantState: StateFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			task := mustSubmit(t, s, newTask("rescue-"+tt.name))
			if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'running', attempt = $2, tries = $2,
				lease_until = now() - interval '1 second' WHERE id = $1::uuid`, task.ID, tt.tries); err != nil {
				t.Fatal(err)
			}
			if _, err := w.rescuer.rescue(ctx); err != nil {
				t.Fatal(err)
			}
			var (
				st    State
				delay time.Duration
				msg   string
			)
			if err := s.pool.QueryRow(ctx, `SELECT state, (extract(epoch FROM run_after - now()) * 1e9)::bigint, error
				FROM idemgate_tasks WHERE id = $1::uuid`, task.ID).Scan(&st, &delay, &msg); err != nil {
				t.Fatal(err)
			}
			if st != tt.wantState {
				t.Fatalf("state = %s (%s); want %s", st, msg, tt.wantState)
			}
			if st == StateFailed {
				if !strings.Contains(msg, "lease expired") {
					t.Fatalf("error = %q; want it to say the lease expired", msg)
				}
				if p := Project(Task{State: st, Error: msg}); p.Error == "" {
					t.Fatal("failed task projects without an error")
				}
				return
			}
			if delay < tt.wantMin-time.Second || delay > tt.wantMax+time.Second {
				t.Fatalf("delay = %v; want within [%v, %v]", delay, tt.wantMin, tt.wantMax)
			}
		})
	}
}

func TestRetryOutcomes(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	var c calls
	handler := func(ctx context.Context, t Task) Outcome {
		n := c.add(t.ID)
		switch t.IdempotencyKey {
		case "flaky":
			return Retry(0, errors.New("flaky upstream"))
		case "later":
			if n == 1 {
				return Retry(time.Hour, errors.New("rate limited"))
			}
		case "panics":
			panic("boom")
		case "empty":
			return Succeeded()
		}
		return Succeeded(json.RawMessage(`1`))
	}
	runWorker(t, newWorker(t, s, WorkerConfig{Handler: handler, MaxAttempts: 3, BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond}))
	flaky := mustSubmit(t, s, newTask("flaky"))
	later := mustSubmit(t, s, newTask("later"))
	panics := mustSubmit(t, s, newTask("panics"))
	empty := mustSubmit(t, s, newTask("empty"))

	waitState(t, s, flaky.ID, StateFailed)
	got, _ := s.Get(context.Background(), flaky.Tenant, flaky.Owner, flaky.ID)
	if c.get(flaky.ID) != 3 || got.Attempt != 3 || got.Error != "gave up after 3 attempts: flaky upstream" {
		t.Errorf("flaky: %d runs, attempt %d, error %q; want 3 runs and a give-up error", c.get(flaky.ID), got.Attempt, got.Error)
	}
	waitState(t, s, panics.ID, StateFailed)
	got, _ = s.Get(context.Background(), panics.Tenant, panics.Owner, panics.ID)
	if !strings.Contains(got.Error, "handler panic: boom") {
		t.Errorf("panics: error %q; want the panic", got.Error)
	}
	waitState(t, s, empty.ID, StateFailed)
	got, _ = s.Get(context.Background(), empty.Tenant, empty.Owner, empty.ID)
	if got.Error != "no result items" {
		t.Errorf("empty success: error %q; want no result items", got.Error)
	}
	waitState(t, s, later.ID, StateRetrying)
	var far bool
	if err := s.pool.QueryRow(context.Background(), "SELECT run_after > now() + interval '59 minutes' FROM idemgate_tasks WHERE id = $1::uuid", later.ID).Scan(&far); err != nil || !far {
		t.Errorf("Retry(1h) scheduled the task sooner (%v)", err)
	}
}

func TestUncertainWaitsForReconcile(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	var c calls
	handler := func(ctx context.Context, t Task) Outcome {
		c.add(t.ID)
		if t.IdempotencyKey == "canary" {
			return Succeeded(json.RawMessage(`1`))
		}
		return Uncertain(errors.New("upstream timed out after the request was sent"))
	}
	cfg := WorkerConfig{Handler: handler, RescueInterval: 10 * time.Millisecond, PollInterval: 10 * time.Millisecond}
	w := newWorker(t, s, cfg)
	stop := runWorker(t, w)
	task := mustSubmit(t, s, newTask("unsure"))
	waitState(t, s, task.ID, StateUncertain)
	if p := Project(mustGet(t, s, task)); p.PollAfter <= 0 || p.Results != nil {
		t.Fatalf("uncertain projects as %+v; want keep polling", p)
	}
	// Make it look overdue in every way a buggy claim or rescue could see.
	if _, err := s.pool.Exec(ctx, "UPDATE idemgate_tasks SET run_after = now() - interval '1 hour', lease_until = now() - interval '1 hour' WHERE id = $1::uuid", task.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := w.rescuer.rescue(ctx); err != nil {
		t.Fatal(err)
	}
	// A task submitted later gets done: the worker kept claiming.
	canary := mustSubmit(t, s, newTask("canary"))
	waitState(t, s, canary.ID, StateSucceeded)
	stop()
	if n := c.get(task.ID); n != 1 || state(t, s, task.ID) != StateUncertain {
		t.Fatalf("uncertain task ran %d times and is %s; want 1 run, still uncertain", n, state(t, s, task.ID))
	}

	var reconciled calls
	r := newWorker(t, s, WorkerConfig{Handler: handler, RescueInterval: 10 * time.Millisecond,
		Reconcile: func(ctx context.Context, t Task) Outcome {
			reconciled.add(t.ID)
			return Succeeded(json.RawMessage(`{"found":"upstream had finished"}`))
		}})
	runWorker(t, r)
	waitState(t, s, task.ID, StateSucceeded)
	got := mustGet(t, s, task)
	if got.ID != task.ID || c.get(task.ID) != 1 || reconciled.get(task.ID) != 1 {
		t.Fatalf("handler ran %d, reconcile %d times; want 1 and 1 on task %s", c.get(task.ID), reconciled.get(task.ID), task.ID)
	}
	if p := Project(got); p.State != StateSucceeded || string(p.Results[0]) != `{"found": "upstream had finished"}` {
		t.Fatalf("projection %+v; want the reconciled result", p)
	}
}

func mustGet(t testing.TB, s *Store, task Task) Task {
	t.Helper()
	got, err := s.Get(context.Background(), task.Tenant, task.Owner, task.ID)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestRecoverStaysOnTheSameTask(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	var c calls
	sawPartial := make(chan []json.RawMessage, 1)
	handler := func(ctx context.Context, t Task) Outcome {
		if c.add(t.ID) == 1 {
			return Failed(errors.New("quota exceeded"), json.RawMessage(`{"frame":1}`))
		}
		sawPartial <- t.Results
		return Succeeded(json.RawMessage(`{"frame":1}`), json.RawMessage(`{"frame":2}`))
	}
	runWorker(t, newWorker(t, s, WorkerConfig{Handler: handler}))
	task := mustSubmit(t, s, newTask("recoverable"))
	waitState(t, s, task.ID, StateFailed)
	if p := Project(mustGet(t, s, task)); p.Error != "quota exceeded" || p.Results != nil {
		t.Fatalf("failed task projects as %+v; want its error and no results", p)
	}
	if _, err := s.Recover(ctx, task.Tenant, "someone-else", task.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Recover by another owner: %v; want ErrNotFound", err)
	}
	got, err := s.Recover(ctx, task.Tenant, task.Owner, task.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != task.ID || got.State != StateRetrying || got.Recoveries != 1 {
		t.Fatalf("Recover = %+v; want the same task, retrying, recovered once", got)
	}
	waitState(t, s, task.ID, StateSucceeded)
	if partial := <-sawPartial; len(partial) != 1 || string(partial[0]) != `{"frame": 1}` {
		t.Fatalf("the recovered attempt saw results %s; want the partial ones", partial)
	}
	if n := countRows(t, s.pool, "idempotency_key = 'recoverable'"); n != 1 {
		t.Fatalf("%d rows for the key; recovery must not create a task", n)
	}
	if _, err := s.Recover(ctx, task.Tenant, task.Owner, task.ID); !errors.Is(err, ErrNotRecoverable) {
		t.Fatalf("Recover of a succeeded task: %v; want ErrNotRecoverable", err)
	}
}

func TestRecoverRefuses(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	tests := []struct {
		name    string
		given   string // SQL SET clause applied to a fresh task
		wantErr error
		wantMsg string
	}{
		{name: "pending", given: "state = 'pending'", wantErr: ErrNotRecoverable, wantMsg: "pending, not failed"},
		{name: "uncertain", given: "state = 'uncertain'", wantErr: ErrNotRecoverable, wantMsg: "uncertain, not failed"},
		{name: "failed without partial results", given: "state = 'failed'", wantErr: ErrNotRecoverable, wantMsg: "without partial results"},
		{name: "failed with only null results", given: "state = 'failed', results = '[null, null]'", wantErr: ErrNotRecoverable, wantMsg: "without partial results"},
		{name: "recovered too often", given: fmt.Sprintf("state = 'failed', results = '[1]', recoveries = %d", MaxRecoveries),
			wantErr: ErrNotRecoverable, wantMsg: "recovered 3 times"},
		{name: "last allowed recovery", given: fmt.Sprintf("state = 'failed', results = '[1]', recoveries = %d", MaxRecoveries-1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			task := mustSubmit(t, s, newTask("refuse-"+tt.name))
			if _, err := s.pool.Exec(ctx, "UPDATE idemgate_tasks SET "+tt.given+" WHERE id = $1::uuid", task.ID); err != nil {
				t.Fatal(err)
			}
			got, err := s.Recover(ctx, task.Tenant, task.Owner, task.ID)
			if !errors.Is(err, tt.wantErr) || (err != nil && !strings.Contains(err.Error(), tt.wantMsg)) {
				t.Fatalf("Recover err = %v; want %v saying %q", err, tt.wantErr, tt.wantMsg)
			}
			if err == nil && (got.ID != task.ID || got.State != StateRetrying) {
				t.Fatalf("Recover = %+v; want the same task retrying", got)
			}
		})
	}
}

func TestShutdown(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		shutdown  time.Duration // ShutdownTimeout
		handler   func(ctx context.Context, finish <-chan struct{}) Outcome
		wantState State
	}{
		// The outcome must be written within the deadline: a generous
		// one, so that a loaded machine makes it.
		{name: "in-flight work finishes", wantState: StateSucceeded, shutdown: patience,
			handler: func(ctx context.Context, finish <-chan struct{}) Outcome {
				<-finish // returns after shutdown began
				return Succeeded(json.RawMessage(`"finished"`))
			}},
		// 2 s, not less: the handler must return within the half of it
		// that Run grants after the cancel, or (by design) its task stays
		// held; 100 ms of it was missed on a loaded machine.
		{name: "work past the deadline is released", wantState: StateRetrying, shutdown: 2 * time.Second,
			handler: func(ctx context.Context, finish <-chan struct{}) Outcome {
				<-ctx.Done()
				return Succeeded(json.RawMessage(`"too late"`))
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, _ := setup(t)
			task := mustSubmit(t, s, newTask("shutdown"))
			entered, finish := make(chan struct{}), make(chan struct{})
			w := newWorker(t, s, WorkerConfig{ShutdownTimeout: tt.shutdown,
				Handler: func(ctx context.Context, t Task) Outcome {
					close(entered)
					return tt.handler(ctx, finish)
				}})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- w.Run(ctx) }()
			<-entered
			cancel()
			close(finish)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			got := mustGet(t, s, task)
			if got.State != tt.wantState {
				t.Fatalf("after shutdown the task is %s; want %s", got.State, tt.wantState)
			}
		})
	}
}

// TestReleasedTaskEndsAfterMaxAttempts: a handler that never finishes
// within ShutdownTimeout is released at every shutdown; each release
// counts as an attempt, so the task fails after MaxAttempts instead of
// coming back for ever.
func TestReleasedTaskEndsAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	task := mustSubmit(t, s, newTask("hangs"))
	const maxAttempts = 2
	for i := 1; i <= maxAttempts; i++ {
		entered := make(chan struct{})
		// The release is written once the handler returned, within the
		// half ShutdownTimeout Run waits for it: 1 s, as 200 ms was
		// missed on a loaded machine.
		w := newWorker(t, s, WorkerConfig{MaxAttempts: maxAttempts, ShutdownTimeout: 2 * time.Second,
			Handler: func(ctx context.Context, t Task) Outcome {
				close(entered)
				<-ctx.Done()
				return Retry(0, ctx.Err())
			}})
		stop := runWorker(t, w)
		<-entered
		stop()
		got := mustGet(t, s, task)
		want := StateRetrying
		if i == maxAttempts {
			want = StateFailed
		}
		if got.State != want || got.Attempt != i {
			t.Fatalf("after release %d the task is %s at attempt %d (%q); want %s", i, got.State, got.Attempt, got.Error, want)
		}
		if want == StateFailed && !strings.Contains(got.Error, "released at shutdown on attempt 2 of 2") {
			t.Fatalf("error = %q; want it to say why", got.Error)
		}
	}
}

// TestRunReturnsAfterItsHandlers: Run waits for the handlers it canceled,
// and a handler that ignores cancellation past the grace writes nothing
// once Run has returned (the caller may have closed the pool); its task
// is not handed back while it may run (its lease runs out instead).
func TestRunReturnsAfterItsHandlers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		ignoresCtx  bool
		wantErr     error // of the outcome's write
		wantReturns bool  // the handler returned before Run
		wantState   State
	}{
		{name: "a handler that honours cancellation returns before Run", wantReturns: true, wantState: StateRetrying},
		{name: "a handler that ignores it cannot write after Run", ignoresCtx: true, wantErr: errWorkerStopped,
			wantState: StateRunning},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, _ := setup(t)
			task := mustSubmit(t, s, newTask("slow-to-stop"))
			var returned atomic.Bool
			entered, unblock := make(chan struct{}), make(chan struct{})
			written := make(chan error, 1)
			w := newWorker(t, s, WorkerConfig{ShutdownTimeout: time.Second,
				Handler: func(ctx context.Context, t Task) Outcome {
					close(entered)
					if tt.ignoresCtx {
						<-unblock
					} else {
						<-ctx.Done()
						time.Sleep(50 * time.Millisecond) // cleans up before returning
					}
					returned.Store(true)
					return Succeeded(json.RawMessage(`"late"`))
				}})
			w.test = &workerTestHooks{onFinish: func(_ Task, _ Outcome, _ bool, err error) { written <- err }}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- w.Run(ctx) }()
			<-entered
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if got := returned.Load(); got != tt.wantReturns {
				t.Fatalf("handler returned before Run: %v; want %v", got, tt.wantReturns)
			}
			close(unblock)
			if err := <-written; !errors.Is(err, tt.wantErr) {
				t.Fatalf("the outcome's write: %v; want %v", err, tt.wantErr)
			}
			if st := state(t, s, task.ID); st != tt.wantState {
				t.Fatalf("task is %s; want %s", st, tt.wantState)
			}
		})
	}
}

func TestPruneDeletesOnlyOldFinishedTasks(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, state, finished_at)
		SELECT 'acme', 'o', 'k', 'r', 'n', 'old-' || g, 'f',
			CASE WHEN g % 3 = 0 THEN 'succeeded' WHEN g % 3 = 1 THEN 'failed' ELSE 'cancelled' END,
			now() - interval '2 hours'
		FROM generate_series(1, 2500) g;
		UPDATE idemgate_tasks SET created_at = now() - interval '3 hours'`); err != nil {
		t.Fatal(err)
	}
	recent := mustSubmit(t, s, newTask("recent"))
	oldPending := mustSubmit(t, s, newTask("old-pending"))
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'succeeded', results = '[1]', finished_at = now() - interval '1 minute' WHERE id = $1::uuid;`, recent.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET created_at = now() - interval '1 day', run_after = now() - interval '1 day' WHERE id = $1::uuid`, oldPending.ID); err != nil {
		t.Fatal(err)
	}
	n, err := s.Prune(ctx, time.Hour)
	if err != nil || n != 2500 {
		t.Fatalf("Prune = %d, %v; want 2500", n, err)
	}
	if left := countRows(t, s.pool, "true"); left != 2 {
		t.Fatalf("%d tasks left; want the recent and the unfinished one", left)
	}
}

// listening matches a worker's LISTEN session in pg_stat_activity.
const listening = "query LIKE 'LISTEN %'"

func TestWorkerWakeUp(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		poll   time.Duration
		submit func(t testing.TB, s *Store) string
	}{
		{name: "a notification wakes it before any poll", poll: time.Hour,
			submit: func(t testing.TB, s *Store) string { return mustSubmit(t, s, newTask("notified")).ID }},
		{name: "polling finds a task nobody announced", poll: 20 * time.Millisecond,
			submit: func(t testing.TB, s *Store) string {
				var id string
				if err := s.pool.QueryRow(context.Background(), `INSERT INTO idemgate_tasks
					(tenant, owner, kind, runtime, network, idempotency_key, fingerprint)
					VALUES ('acme', 'o', 'image', 'gpu', 'main', 'silent', 'f') RETURNING id::text`).Scan(&id); err != nil {
					t.Fatal(err)
				}
				return id
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, _ := setup(t)
			w := newWorker(t, s, WorkerConfig{PollInterval: tt.poll, Handler: func(context.Context, Task) Outcome {
				return Succeeded(json.RawMessage(`1`))
			}})
			runWorker(t, w)
			// Wait until the worker listens and is idle: it claimed at start
			// and once more on the wake-up it gives itself after LISTEN.
			wait.For(t, patience, "the worker listens and is idle", func() bool {
				return countActivity(t, s.pool, listening) == 1 && w.claims.Load() >= 2
			})
			id := tt.submit(t, s)
			waitState(t, s, id, StateSucceeded)
		})
	}
}

// panicError is an error whose Error method panics, as a typed nil
// pointer's does.
type panicError struct{ msg *string }

func (e *panicError) Error() string { return *e.msg }

// A handler's error whose Error method panics (a typed nil) must not
// take the worker down: the outcome is recorded with a text saying so.
func TestHandlerErrorThatPanicsIsRecorded(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	var c calls
	var nilErr *panicError
	w := newWorker(t, s, WorkerConfig{MaxAttempts: 3, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
		Handler: func(ctx context.Context, t Task) Outcome {
			c.add(t.ID)
			switch t.IdempotencyKey {
			case "failed":
				return Failed(nilErr)
			case "retry":
				return Retry(time.Hour, nilErr)
			default:
				return Uncertain(&panicError{})
			}
		}})
	runWorker(t, w)
	failed := mustSubmit(t, s, newTask("failed"))
	retried := mustSubmit(t, s, newTask("retry"))
	uncertain := mustSubmit(t, s, newTask("uncertain"))
	waitState(t, s, failed.ID, StateFailed)
	waitState(t, s, retried.ID, StateRetrying)
	waitState(t, s, uncertain.ID, StateUncertain)
	for _, task := range []Task{failed, retried, uncertain} {
		if n := c.get(task.ID); n != 1 {
			t.Errorf("task %s ran %d times; want once", task.IdempotencyKey, n)
		}
		if got := mustGet(t, s, task); !strings.Contains(got.Error, "panic") {
			t.Errorf("task %s: error %q; want a text saying the error's text panicked", task.IdempotencyKey, got.Error)
		}
	}
}

// A handler that leaves its goroutine with runtime.Goexit (t.FailNow in
// a test's handler does) ends its attempt like a panic: the task goes by
// its kind's Lost policy and the slot is freed, not held until Timeout.
func TestHandlerGoexitEndsTheAttempt(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	var c calls
	w := newWorker(t, s, WorkerConfig{Concurrency: 1, MaxAttempts: 2, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
		Handler: func(ctx context.Context, t Task) Outcome {
			if c.add(t.ID) == 1 && t.IdempotencyKey == "goexit" {
				runtime.Goexit()
			}
			return Succeeded(json.RawMessage(`"ok"`))
		}})
	runWorker(t, w)
	gone := mustSubmit(t, s, newTask("goexit"))
	waitState(t, s, gone.ID, StateSucceeded)
	if n := c.get(gone.ID); n != 2 {
		t.Fatalf("handler ran %d times; want the lost attempt retried once", n)
	}
	next := mustSubmit(t, s, newTask("after"))
	waitState(t, s, next.ID, StateSucceeded)
}

// a panic in Reconcile must leave the task uncertain; it never
// runs the handler again.
func TestReconcilePanicKeepsTheTaskUncertain(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	var c calls
	var panics atomic.Int64
	w := newWorker(t, s, WorkerConfig{RescueInterval: 20 * time.Millisecond, ReconcileInterval: 10 * time.Millisecond,
		BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
		Handler: func(ctx context.Context, t Task) Outcome {
			c.add(t.ID)
			return Uncertain(errors.New("upstream timed out"))
		},
		Reconcile: func(ctx context.Context, t Task) Outcome {
			panics.Add(1)
			panic("reconcile bug")
		}})
	runWorker(t, w)
	task := mustSubmit(t, s, newTask("reconcile-panics"))
	wait.For(t, patience, "three panics", func() bool { return panics.Load() >= 3 })
	if n := c.get(task.ID); n != 1 {
		t.Fatalf("the handler ran %d times; an uncertain task must never run again by itself", n)
	}
	if st := state(t, s, task.ID); st != StateUncertain {
		t.Fatalf("task is %s after Reconcile panicked; want uncertain", st)
	}
}

// a worker that still runs a stale attempt of a task must not
// claim the task again; the stale attempt's context is cancelled.
func TestWorkerDoesNotReclaimATaskItStillRuns(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	var (
		c          calls
		overlap    atomic.Int64
		running    atomic.Int64
		entered    = make(chan struct{})
		unblock    = make(chan struct{})
		firstCtx   = make(chan context.Context, 1)
		secondDone = make(chan struct{})
	)
	w := newWorker(t, s, WorkerConfig{Lease: time.Hour, Heartbeat: beatUnderLoad, PollInterval: 10 * time.Millisecond,
		Handler: func(ctx context.Context, t Task) Outcome {
			if running.Add(1) > 1 {
				overlap.Add(1)
			}
			defer running.Add(-1)
			if c.add(t.ID) == 1 {
				firstCtx <- ctx
				close(entered)
				<-unblock // ignores its context
				return Succeeded(json.RawMessage(`"stale"`))
			}
			defer close(secondDone)
			return Succeeded(json.RawMessage(`"second"`))
		}})
	runWorker(t, w)
	task := mustSubmit(t, s, newTask("reclaimed"))
	waitEntered(t, s, entered)
	ctx1 := <-firstCtx
	// Another worker's rescuer requeued the task (the lease looked expired).
	if _, err := s.pool.Exec(context.Background(), `UPDATE idemgate_tasks SET state = 'retrying', run_after = now(),
		lease_until = NULL WHERE id = $1::uuid`, task.ID); err != nil {
		t.Fatal(err)
	}
	if !wait.Until(patience, func() bool { return ctx1.Err() != nil }) {
		t.Fatalf("the stale attempt's context was never cancelled (handler ran %d times)", c.get(task.ID))
	}
	claims := w.claims.Load()
	wait.For(t, patience, "three more claims", func() bool { return w.claims.Load() >= claims+3 })
	if n := c.get(task.ID); n != 1 || overlap.Load() != 0 {
		t.Fatalf("the worker ran the task %d times (%d overlapping) while its stale attempt ran", n, overlap.Load())
	}
	close(unblock)
	waitEntered(t, s, secondDone)
	waitState(t, s, task.ID, StateSucceeded)
	if got := mustGet(t, s, task); got.Attempt != 2 || string(got.Results[0]) != `"second"` {
		t.Fatalf("task %+v; want the second attempt's success", got)
	}
}

// A worker's slots: a handed-off attempt frees its slot but still counts
// against the bound of outcomes waiting for their write (four a slot).
func TestAttemptsFree(t *testing.T) {
	t.Parallel()
	newA := func(id string) *attempt {
		a := newAttempt(context.Background(), Task{ID: id}, StateRunning, KindPolicy{}, time.Now(), time.Hour)
		t.Cleanup(a.stop)
		return a
	}
	tests := []struct {
		name            string
		given, handedIn int // attempts registered, of which handed off
		want            int // free at concurrency 4
	}{
		{name: "idle", want: 4},
		{name: "all running", given: 4, want: 0},
		{name: "some handed off", given: 4, handedIn: 3, want: 3},
		{name: "held outcomes at the bound", given: 20, handedIn: 18, want: 0},
		{name: "held outcomes near the bound", given: 19, handedIn: 18, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var as attempts
			var all []*attempt
			for i := range tt.given {
				all = append(all, newA(fmt.Sprint(i)))
			}
			as.register(all, as.beginClaim(4))
			for _, a := range all[:tt.handedIn] {
				as.handOff(a)
				as.handOff(a) // twice counts once
			}
			if got := as.free(4); got != tt.want {
				t.Errorf("free = %d; want %d", got, tt.want)
			}
			for _, a := range all {
				as.remove(a)
			}
			if as.count() != 0 || as.writing != 0 {
				t.Errorf("after removing all: count %d, writing %d; want 0, 0", as.count(), as.writing)
			}
		})
	}
}

// While a backlog waits, the claim loop waits up to claimGather for every
// slot to be free. A claim of uncertain tasks (Reconcile) that takes the
// slots left between the end of that wait and the loop's next look at
// them must not leave the loop waiting for every slot: its timer is
// spent, so it would claim again only once all slots were free.
func TestClaimLoopClaimsAfterAReconcileTookTheGatheredSlots(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	release := map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{}), "u": make(chan struct{})}
	started := make(chan string, 10)
	h := func(ctx context.Context, t Task) Outcome {
		started <- t.IdempotencyKey
		if ch := release[t.IdempotencyKey]; ch != nil {
			select {
			case <-ch:
			case <-ctx.Done():
			}
		}
		return Succeeded(json.RawMessage(`1`))
	}
	waitStarted := func(want string) {
		t.Helper()
		select {
		case got := <-started:
			if got != want {
				t.Fatalf("%q started; want %q", got, want)
			}
		case <-time.After(patience):
			t.Fatalf("%q did not start", want)
		}
	}
	var armed atomic.Bool
	w := newWorker(t, s, WorkerConfig{Concurrency: 2, Handler: h, Reconcile: h, RescueInterval: time.Hour})
	w.test = &workerTestHooks{gathered: func() {
		if armed.CompareAndSwap(true, false) {
			if err := w.reconcile(ctx, ctx); err != nil {
				t.Errorf("reconcile: %v", err)
			}
		}
	}}
	runWorker(t, w)
	mustSubmit(t, s, newTask("a"))
	waitStarted("a")
	mustSubmit(t, s, newTask("b"))
	waitStarted("b")
	// Both slots are taken (the last claim was full: a backlog may wait).
	u := mustSubmit(t, s, newTask("u"))
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'uncertain', attempt = 1, tries = 1,
		run_after = now() - interval '1 second' WHERE id = $1::uuid`, u.ID); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	close(release["a"]) // a slot frees: the loop waits for the other, then the Reconcile takes it
	waitStarted("u")
	mustSubmit(t, s, newTask("c"))
	close(release["b"]) // one of two slots frees while u's Reconcile runs on
	select {
	case got := <-started:
		if got != "c" {
			t.Fatalf("%q started; want c", got)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("c did not start in 3s with a slot free: the claim loop waits for every slot")
	}
	close(release["u"])
}
