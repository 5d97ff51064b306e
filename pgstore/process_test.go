package pgstore

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/wait"
)

// workerProcessEnv, set to a database URL, makes the test binary a worker
// process (see TestMain): a test starts several and kills some.
const workerProcessEnv = "PGSTORE_TEST_WORKER_DSN"

// workerProcess runs one Worker on dsn, whose handler sleeps
// PGSTORE_TEST_HANDLER_MS, until SIGTERM (or SIGKILL). It prints "ready"
// once it runs.
func workerProcess(dsn string) int {
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

// startWorkerProcess starts the test binary as a worker process on dsn and
// waits until it runs; the test's cleanup kills it.
func startWorkerProcess(t testing.TB, dsn string, handler time.Duration) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), workerProcessEnv+"="+dsn, fmt.Sprintf("PGSTORE_TEST_HANDLER_MS=%d", handler.Milliseconds()))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("worker process: %q, %v", line, err)
	}
	return cmd
}

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
	procs := make([]*exec.Cmd, processes)
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
			_ = procs[0].Process.Kill() // SIGKILL: its attempts hold their leases until they end
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
