package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/proctest"
	"github.com/idemgate/idemgate/internal/proxy"
	"github.com/idemgate/idemgate/internal/wait"
)

// Environment of a counting worker process (see countingWorkerProcess).
const (
	countingEnv        = "PGSTORE_TEST_COUNTING"      // set: the worker process is a counting one
	countingNameEnv    = "PGSTORE_TEST_COUNTING_NAME" // the worker's Name
	countingViaEnv     = "PGSTORE_TEST_COUNTING_VIA"  // host:port of the proxy the worker reaches the database through
	countingTimeoutEnv = "PGSTORE_TEST_COUNTING_TIMEOUT_MS"
	countingStopEnv    = "PGSTORE_TEST_COUNTING_SHUTDOWN_MS"
	countingLeaseEnv   = "PGSTORE_TEST_COUNTING_LEASE_MS"
)

// countingKind is the kind the counting workers run, with MaxRunning 1.
const countingKind = "image"

// countingParams say what a counting handler (or Reconcile) does: run for
// MS (0: until its context ends), then panic or return Uncertain or
// Succeeded. Once its context has ended it takes WindDownMS more before
// it returns: a handler that honours its context, and needs a moment to
// stop (an upstream request to abort).
type countingParams struct {
	MS          int  `json:"ms"`
	ReconcileMS int  `json:"reconcile_ms"`
	WindDownMS  int  `json:"wind_down_ms"`
	Panic       bool `json:"panic"`
	Uncertain   bool `json:"uncertain"`
}

// countingSchema is the handlers' counter: how many run now and the most
// that ran at once, per kind and per task (any attempt).
const countingSchema = `
CREATE TABLE idemgate_test_live (kind text PRIMARY KEY, n int NOT NULL, peak int NOT NULL, starts int NOT NULL);
CREATE TABLE idemgate_test_live_task (id uuid PRIMARY KEY, n int NOT NULL, peak int NOT NULL, starts int NOT NULL);`

// countIn counts a handler in: its kind's and its task's.
func countIn(ctx context.Context, pool *pgxpool.Pool, t Task) error {
	if _, err := pool.Exec(ctx, `INSERT INTO idemgate_test_live AS l VALUES ($1, 1, 1, 1)
ON CONFLICT (kind) DO UPDATE SET n = l.n + 1, peak = greatest(l.peak, l.n + 1), starts = l.starts + 1`, t.Kind); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `INSERT INTO idemgate_test_live_task AS l VALUES ($1::uuid, 1, 1, 1)
ON CONFLICT (id) DO UPDATE SET n = l.n + 1, peak = greatest(l.peak, l.n + 1), starts = l.starts + 1`, t.ID)
	return err
}

// countOut counts a handler out, as it returns.
func countOut(ctx context.Context, pool *pgxpool.Pool, t Task) error {
	if _, err := pool.Exec(ctx, `UPDATE idemgate_test_live_task SET n = n - 1 WHERE id = $1::uuid`, t.ID); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `UPDATE idemgate_test_live SET n = n - 1 WHERE kind = $1`, t.Kind)
	return err
}

// countingHandler is the handler (reconcile: the Reconcile) of a counting
// worker: it is counted in before it does anything and out just before
// it returns, so that two handlers counted at once certainly ran at once.
// live counts the handlers running: the process waits for them to count
// themselves out before it closes counter (see countingWorkerProcess).
func countingHandler(counter *pgxpool.Pool, live *sync.WaitGroup, reconcile bool) Handler {
	return func(ctx context.Context, t Task) Outcome {
		live.Add(1)
		defer live.Done()
		var p countingParams
		if err := json.Unmarshal(t.Params, &p); err != nil {
			return Failed(err)
		}
		bg := context.WithoutCancel(ctx)
		if err := countIn(bg, counter, t); err != nil {
			fmt.Fprintln(os.Stderr, "count in:", err)
			os.Exit(3)
		}
		defer func() {
			if err := countOut(bg, counter, t); err != nil {
				fmt.Fprintln(os.Stderr, "count out:", err)
				os.Exit(3)
			}
		}()
		ms := p.MS
		if reconcile {
			ms = p.ReconcileMS
		}
		var done <-chan time.Time
		if ms > 0 {
			done = time.After(time.Duration(ms) * time.Millisecond)
		}
		select {
		case <-ctx.Done():
			time.Sleep(time.Duration(p.WindDownMS) * time.Millisecond)
			return Retry(0, context.Cause(ctx))
		case <-done:
		}
		switch {
		case p.Panic:
			panic("a planned panic")
		case p.Uncertain && !reconcile:
			return Uncertain(errors.New("planned"))
		}
		return Succeeded(json.RawMessage(`1`))
	}
}

// countingWorkerProcess runs one counting Worker on dsn until SIGTERM:
// Concurrency 2, a short lease, Handler and Reconcile countingHandler,
// the worker's pool through the proxy at countingViaEnv and the counter
// on a pool of its own, straight to the database, so that it counts
// while the worker's link is cut.
//
// Once Run has returned, the process waits for its handlers to count
// themselves out before it closes the counter and exits. Run may rightly
// return while a handler still winds down (past its shutdown grace on a
// loaded machine): the task stays held until its lease ends. Exiting then
// would kill the handler before it counted out, and the counter would see
// a handler that no longer runs overlap the next attempt. Waiting keeps
// a real overlap visible: a handler whose task was handed on too early
// is still counted in when another worker counts the task in.
func countingWorkerProcess(dsn string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return fail(err)
	}
	host, port, err := net.SplitHostPort(os.Getenv(countingViaEnv))
	if err != nil {
		return fail(err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return fail(err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = host, uint16(p), nil
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	counter, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return fail(err)
	}
	defer counter.Close()
	s, err := New(ctx, pool)
	if err != nil {
		return fail(err)
	}
	ms := func(env string, def int) time.Duration {
		n, err := strconv.Atoi(os.Getenv(env))
		if err != nil {
			n = def
		}
		return time.Duration(n) * time.Millisecond
	}
	lease := ms(countingLeaseEnv, 3000)
	var live sync.WaitGroup
	w, err := NewWorker(s, WorkerConfig{Name: os.Getenv(countingNameEnv), Concurrency: 2, Kinds: []string{countingKind},
		Lease: lease, Heartbeat: lease / 5, RescueInterval: 100 * time.Millisecond, PollInterval: 100 * time.Millisecond,
		ReconcileInterval: 50 * time.Millisecond, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
		MaxAttempts: 3, ShutdownTimeout: ms(countingStopEnv, 5000),
		Policies: map[string]KindPolicy{countingKind: {Timeout: ms(countingTimeoutEnv, 60000)}},
		Handler:  countingHandler(counter, &live, false), Reconcile: countingHandler(counter, &live, true)})
	if err != nil {
		return fail(err)
	}
	fmt.Println("ready")
	err = w.Run(ctx)
	// No handler starts once Run has returned, so live.Wait may follow
	// the handlers' live.Add.
	live.Wait()
	if err != nil {
		return fail(err)
	}
	return 0
}

// countingCluster is a database with counting worker processes on it.
type countingCluster struct {
	s       *Store
	db      testDB
	procs   []*proctest.Process
	proxies []*proxy.Proxy // each process's link to the database
}

// startCounting starts n counting worker processes, each named w<i> and
// linked to the database through a proxy of its own, with env added.
func startCounting(t *testing.T, n int, env ...string) *countingCluster {
	t.Helper()
	s, db := setup(t)
	ctx := context.Background()
	if _, err := s.pool.Exec(ctx, countingSchema); err != nil {
		t.Fatal(err)
	}
	if err := s.SetKindLimits(ctx, countingKind, KindLimits{MaxRunning: 1}); err != nil {
		t.Fatal(err)
	}
	c := &countingCluster{s: s, db: db}
	cfg, err := pgxpool.ParseConfig(db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		px, err := proxy.Start(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = px.Close() })
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), append([]string{workerProcessEnv + "=" + db.dsn, countingEnv + "=1",
			countingViaEnv + "=" + px.Addr, fmt.Sprintf("%s=w%d", countingNameEnv, i)}, env...)...)
		proc, err := proctest.Start(t, cmd)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(px.Heal) // before the process is stopped: a frozen one could not stop
		if _, err := proc.WaitOutput(workerReady, patience); err != nil {
			t.Fatal(err)
		}
		c.procs, c.proxies = append(c.procs, proc), append(c.proxies, px)
	}
	return c
}

// submit submits n tasks of countingKind with params p.
func (c *countingCluster) submit(t *testing.T, prefix string, n int, p countingParams) []Task {
	t.Helper()
	return c.submitAt(t, prefix, n, p, time.Time{})
}

// submitAt submits n tasks of countingKind with params p, to run after
// runAfter.
func (c *countingCluster) submitAt(t *testing.T, prefix string, n int, p countingParams, runAfter time.Time) []Task {
	t.Helper()
	params, _ := json.Marshal(p)
	batch := make([]NewTask, n)
	for i := range batch {
		batch[i] = tenantTask(fmt.Sprintf("tenant-%d", i%3), fmt.Sprintf("%s-%d", prefix, i))
		batch[i].Kind, batch[i].Params, batch[i].RunAfter = countingKind, params, runAfter
	}
	got, err := c.s.SubmitMany(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	tasks := make([]Task, len(got))
	for i, r := range got {
		tasks[i] = r.Task
	}
	return tasks
}

// live returns a task whose handler (or Reconcile) runs now, and the
// worker that runs it, or "" when none does.
func (c *countingCluster) live(t *testing.T) (Task, string) {
	t.Helper()
	var id, worker string
	err := c.s.pool.QueryRow(context.Background(), `SELECT t.id::text, coalesce(t.locked_by, '')
FROM idemgate_tasks t JOIN idemgate_test_live_task l ON l.id = t.id
WHERE l.n > 0 AND t.state IN ('running', 'uncertain') LIMIT 1`).Scan(&id, &worker)
	if errors.Is(err, pgx.ErrNoRows) {
		return Task{}, ""
	}
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.s.Operator().Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return task, worker
}

// unfinished counts the tasks not yet finished.
func (c *countingCluster) unfinished(t *testing.T) int {
	t.Helper()
	return countRows(t, c.s.pool, "state IN ('pending', 'running', 'retrying', 'uncertain')")
}

// check fails the test if more handlers of the kind ran at once than
// MaxRunning 1, or two attempts of one task ran at once.
func (c *countingCluster) check(t *testing.T) {
	t.Helper()
	var peak, starts, taskPeak int
	if err := c.s.pool.QueryRow(context.Background(), `SELECT coalesce(max(peak), 0), coalesce(sum(starts), 0),
	(SELECT coalesce(max(peak), 0) FROM idemgate_test_live_task) FROM idemgate_test_live`).Scan(&peak, &starts, &taskPeak); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d handler starts; at most %d at once; at most %d attempts of one task at once", starts, peak, taskPeak)
	if peak > 1 {
		t.Errorf("%d handlers of a MaxRunning 1 kind ran at once", peak)
	}
	if taskPeak > 1 {
		t.Errorf("%d attempts of one task ran at once", taskPeak)
	}
	if starts == 0 {
		t.Error("no handler ran: the test tested nothing")
	}
}

// Every way an attempt ends frees its kind's slot (MaxRunning 1) and its
// task only once its handler has returned: three worker processes
// (Concurrency 2 each) run a kind limited to one attempt at once, and
// handlers that honour their context but take a moment to stop count
// themselves in and out in Postgres. At no time may two handlers of the
// kind, or two attempts of one task, have been counted in at once.
func TestAttemptEndsFreeTheSlotOnlyWhenTheHandlerStopped(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  []string
		// run submits tasks and acts on the cluster until the tasks are
		// done.
		run func(t *testing.T, c *countingCluster)
	}{
		{name: "completed", run: func(t *testing.T, c *countingCluster) {
			c.submit(t, "done", 6, countingParams{MS: 50})
			wait.For(t, patience, "every task succeeded", func() bool { return c.unfinished(t) == 0 })
		}},
		{name: "panicked", run: func(t *testing.T, c *countingCluster) {
			c.submit(t, "panic", 3, countingParams{MS: 50, Panic: true})
			wait.For(t, patience, "every task failed", func() bool { return c.unfinished(t) == 0 })
		}},
		{name: "timed out", env: []string{countingTimeoutEnv + "=200"}, run: func(t *testing.T, c *countingCluster) {
			// The handler stops within the heartbeat that a timeout grants.
			c.submit(t, "slow", 3, countingParams{WindDownMS: 100})
			wait.For(t, patience, "every task failed", func() bool { return c.unfinished(t) == 0 })
		}},
		{name: "cancelled", run: func(t *testing.T, c *countingCluster) {
			c.submit(t, "cancel", 4, countingParams{WindDownMS: 600})
			c.cancelEach(t)
		}},
		{name: "cancelled while reconciled", run: func(t *testing.T, c *countingCluster) {
			c.makeUncertain(t, c.submitAt(t, "cancel-rec", 4, countingParams{WindDownMS: 600}, time.Now().Add(time.Hour)))
			c.cancelEach(t)
		}},
		{name: "reconciled", run: func(t *testing.T, c *countingCluster) {
			c.makeUncertain(t, c.submitAt(t, "rec", 4, countingParams{ReconcileMS: 50}, time.Now().Add(time.Hour)))
			c.submit(t, "run", 4, countingParams{MS: 50})
			wait.For(t, patience, "every task succeeded", func() bool { return c.unfinished(t) == 0 })
		}},
		{name: "released at shutdown", env: []string{countingStopEnv + "=2000", countingLeaseEnv + "=6000"}, run: func(t *testing.T, c *countingCluster) {
			// The handler is cancelled at shutdown and stops soon after,
			// mostly within the half ShutdownTimeout that Run waits for
			// it. On a loaded machine it may stop after Run returned: its
			// process waits for it to count out, and the long lease keeps
			// its task held until then (a lease that ended under a running
			// handler would be a true overlap).
			c.submit(t, "release", 2, countingParams{MS: 4000, WindDownMS: 200})
			stopped := map[string]bool{}
			for range 2 {
				var worker string
				wait.For(t, patience, "a handler runs in a worker not stopped", func() bool {
					_, worker = c.live(t)
					return worker != "" && !stopped[worker]
				})
				stopped[worker] = true
				i, _ := strconv.Atoi(worker[1:])
				if err := c.procs[i].Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
				if err := c.procs[i].Wait(patience); err != nil {
					t.Logf("worker %s: %v", worker, err)
				}
			}
			wait.For(t, patience, "every task succeeded", func() bool { return c.unfinished(t) == 0 })
		}},
		{name: "lease lost", env: []string{countingLeaseEnv + "=2000"}, run: func(t *testing.T, c *countingCluster) {
			c.submit(t, "lost", 2, countingParams{MS: 3000, WindDownMS: 100})
			var worker string
			wait.For(t, patience, "a handler runs", func() bool { _, worker = c.live(t); return worker != "" })
			i, _ := strconv.Atoi(worker[1:])
			c.proxies[i].Set(proxy.Freeze, 0) // its heartbeats go unanswered: the lease runs out
			wait.For(t, patience, "another worker runs the tasks", func() bool { return c.unfinished(t) == 0 })
			c.proxies[i].Heal()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := startCounting(t, 3, tt.env...)
			tt.run(t, c)
			c.check(t)
		})
	}
}

// cancelEach cancels every task once its handler (or Reconcile) runs,
// until none is left.
func (c *countingCluster) cancelEach(t *testing.T) {
	t.Helper()
	wait.For(t, patience, "every task is cancelled", func() bool {
		if task, _ := c.live(t); task.ID != "" {
			if _, err := c.s.Operator().Cancel(context.Background(), task.ID); err != nil {
				t.Fatal(err)
			}
		}
		return c.unfinished(t) == 0
	})
	if n := countRows(t, c.s.pool, "state <> 'cancelled'"); n != 0 {
		t.Fatalf("%d tasks not cancelled", n)
	}
}

// makeUncertain makes tasks (submitted for later) uncertain, due for a
// Reconcile now.
func (c *countingCluster) makeUncertain(t *testing.T, tasks []Task) {
	t.Helper()
	ids := make([]string, len(tasks))
	for i, task := range tasks {
		ids[i] = task.ID
	}
	tag, err := c.s.pool.Exec(context.Background(), `UPDATE idemgate_tasks SET state = 'uncertain', attempt = 1, tries = 1,
	lost = 'uncertain', run_after = now() WHERE id = ANY($1::uuid[]) AND state = 'pending'`, ids)
	if err != nil {
		t.Fatal(err)
	}
	if int(tag.RowsAffected()) != len(ids) {
		t.Fatalf("%d of %d tasks made uncertain: a worker claimed some first", tag.RowsAffected(), len(ids))
	}
}
