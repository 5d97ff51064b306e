package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/proctest"
	"github.com/idemgate/idemgate/internal/wait"
)

// workerProcessEnv, set to a database URL, makes the test binary a worker
// process (see TestMain): a test starts several and kills some.
const workerProcessEnv = "PGSTORE_TEST_WORKER_DSN"

// workerProcess runs one Worker on dsn, whose handler sleeps
// PGSTORE_TEST_HANDLER_MS, until SIGTERM (or SIGKILL). It prints "ready"
// once it runs.
func workerProcess(dsn string) int {
	if os.Getenv(countingEnv) != "" {
		return countingWorkerProcess(dsn)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	s, err := New(ctx, pool)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ms, _ := strconv.Atoi(os.Getenv("PGSTORE_TEST_HANDLER_MS"))
	w, err := NewWorker(s, WorkerConfig{Concurrency: 16, Lease: 2 * time.Second, Heartbeat: 400 * time.Millisecond,
		RescueInterval: 200 * time.Millisecond, PollInterval: 100 * time.Millisecond, BackoffBase: time.Millisecond,
		BackoffMax: time.Millisecond,
		Handler: func(ctx context.Context, _ Task) Outcome {
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(ms) * time.Millisecond):
			}
			return Succeeded(json.RawMessage(`1`))
		}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready")
	if err := w.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// startWorkerProcess starts the test binary as a worker process on dsn
// (through proctest: it dies with the test binary, and the test's cleanup
// stops it, logging its output if the test failed) and waits until it
// runs.
func startWorkerProcess(t testing.TB, dsn string, handler time.Duration) *proctest.Process {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), workerProcessEnv+"="+dsn, fmt.Sprintf("PGSTORE_TEST_HANDLER_MS=%d", handler.Milliseconds()))
	p, err := proctest.Start(t, cmd)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.WaitOutput(workerReady, patience); err != nil {
		t.Fatal(err)
	}
	return p
}

// workerReady is the line a worker process prints once it runs.
var workerReady = regexp.MustCompile(`^ready$`)

// MaxRunning holds across worker processes, while they race for the last
// slots and after one is killed (SIGKILL) with attempts running: from the
// attempts' claim and end times in the database, and sampled while they
// run. With PGSTORE_MEASURE set it prints the throughput at the limit.
//
//	PGSTORE_MEASURE=1 go test -count=1 -v -run TestMaxRunningAcrossWorkerProcesses ./pgstore/
func TestMaxRunningAcrossWorkerProcesses(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	ctx := context.Background()
	attemptLog(t, s.pool)
	const maxRunning, processes, total = 8, 4, 400
	const handler = 20 * time.Millisecond
	if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunning: maxRunning}); err != nil {
		t.Fatal(err)
	}
	var batch []NewTask
	for i := range total {
		batch = append(batch, tenantTask(fmt.Sprintf("tenant-%d", i%10), fmt.Sprintf("proc-%d", i)))
	}
	if _, err := s.SubmitMany(ctx, batch); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	procs := make([]*proctest.Process, processes)
	for i := range procs {
		procs[i] = startWorkerProcess(t, db.dsn, handler)
	}
	sampled, killed := 0, false
	done := func() bool { return countRows(t, s.pool, "state = 'succeeded'") == total }
	wait.For(t, patience, "every task succeeded", func() bool {
		var running int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM idemgate_tasks
			WHERE state = 'running' AND lease_until > now()`).Scan(&running); err != nil {
			t.Fatal(err)
		}
		sampled = max(sampled, running)
		if !killed && countRows(t, s.pool, "state = 'succeeded'") > total/3 {
			// SIGKILL: its attempts hold their leases until they end.
			if err := procs[0].Kill(); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
		return done()
	})
	took := time.Since(began)
	ivs := attemptIntervals(t, s.pool)
	most := maxOverlap(ivs, "")
	if most > maxRunning || sampled > maxRunning {
		t.Fatalf("%d attempts held a lease at once (%d sampled); want ≤ MaxRunning %d", most, sampled, maxRunning)
	}
	if most < maxRunning/2 {
		t.Fatalf("at most %d attempts at once; want the limit used", most)
	}
	if os.Getenv("PGSTORE_MEASURE") != "" {
		t.Logf("%d processes × 16 slots, MaxRunning %d, %v handler, one process killed: %d tasks (%d attempts) in %v = %.0f tasks/s; "+
			"at most %d at once by the attempts' times, %d sampled; ideal at the limit %.0f tasks/s",
			processes, maxRunning, handler, total, len(ivs), took.Round(time.Millisecond), float64(total)/took.Seconds(),
			most, sampled, float64(maxRunning)/handler.Seconds())
	}
}

// Fair claiming holds across worker processes: three processes (16 slots
// each, 10 ms handler) drain tenant A's backlog of 2,000 tasks; a lone
// task of tenant B, submitted while they do, starts within the first
// 2 × 48 starts after its submit (counted from the attempts' claims in
// the database, by the database's clock), not behind the rest of A's
// backlog. With the FIFO claim of before (sqlClaimFIFO in the worker
// processes) it started after 1,677 and 1,860 starts in two runs.
func TestFairnessAcrossWorkerProcesses(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	ctx := context.Background()
	attemptLog(t, s.pool)
	const processes, slots, backlog = 3, 16, 2000
	const handler = 10 * time.Millisecond
	// The processes run before the backlog comes, so that all of them
	// race for it: started one after another beside it, the first could
	// drain much of it before a loaded machine had started the others
	// (the test then failed its own precondition, "1 processes started
	// tasks").
	for range processes {
		startWorkerProcess(t, db.dsn, handler)
	}
	batch := make([]NewTask, backlog)
	for i := range batch {
		batch[i] = tenantTask("acme", fmt.Sprintf("a-%d", i))
	}
	if _, err := s.SubmitMany(ctx, batch); err != nil {
		t.Fatal(err)
	}
	// Every process claims by now: B comes into a drain in full swing.
	wait.For(t, patience, "A's backlog drains", func() bool { return countRows(t, s.pool, "state = 'succeeded'") >= 2*processes*slots })
	b := mustSubmit(t, s, tenantTask("beta", "b-lone"))
	waitState(t, s, b.ID, StateSucceeded)
	// Starts (first claims of an attempt) after B's submit and before
	// B's; A's starts before B's in all; the processes that started any.
	var before, ahead, workers int
	if err := s.pool.QueryRow(ctx, `
WITH starts AS (
	SELECT id, min(at) AS at, min(worker) AS worker FROM idemgate_test_attempts
	WHERE state = 'running' GROUP BY id, attempt
), b AS (SELECT at FROM starts WHERE id = $1::uuid)
SELECT count(*) FILTER (WHERE starts.at < b.at AND starts.at > (SELECT created_at FROM idemgate_tasks WHERE id = $1::uuid)),
	count(*) FILTER (WHERE starts.at < b.at),
	count(DISTINCT worker)
FROM starts, b`, b.ID).Scan(&before, &ahead, &workers); err != nil {
		t.Fatal(err)
	}
	t.Logf("B's task started after %d starts since its submit; %d of A's %d tasks had not started; %d processes started tasks",
		before, backlog-ahead, backlog, workers)
	if limit := 2 * processes * slots; before > limit {
		t.Fatalf("B's task started after %d starts since its submit; want at most %d (2 × %d slots): claims are not fair across processes",
			before, limit, processes*slots)
	}
	if backlog-ahead < 2*processes*slots || workers < 2 {
		t.Fatalf("%d of A's tasks left when B started, %d processes started tasks: the test did not race several processes on a backlog",
			backlog-ahead, workers)
	}
}
