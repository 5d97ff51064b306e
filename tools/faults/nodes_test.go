//go:build faults

package faults

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/internal/wait"
)

// cluster is the shared stores of a multi-process case and the example
// processes' environment.
type cluster struct {
	env  []string
	db   *pgxpool.Pool
	auth http.Header
}

func newCluster(t *testing.T, tenant string) *cluster {
	t.Helper()
	dsn := testenv.PostgresDSN(t)
	ro := testenv.Redis(t)
	c := &cluster{env: []string{
		"DATABASE_URL=" + dsn,
		fmt.Sprintf("REDIS_URL=redis://%s/%d", ro.Addr, ro.DB),
		"JWT_SECRET=faults-suite-secret-0123456789abcdef",
	}}
	// The first node migrates; this pool only reads.
	db, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	c.db = db
	c.auth = http.Header{"Authorization": {"Bearer " + token(t, c.env, tenant, "alice")}}
	return c
}

// TestAPINodeKilled SIGKILLs an API node while its handlers run (held in
// their INSERT by a table lock): the clients' retries go to the other node,
// which answers 409 request_in_progress until the dead node's lease
// expires, then takes over; every action ends with exactly one task.
func TestAPINodeKilled(t *testing.T) {
	t.Parallel()
	const tenant = "faults-node-killed"
	c := newCluster(t, tenant)
	a, urlA := startServe(t, c.env)
	_, urlB := startServe(t, c.env)
	ctx := context.Background()

	lock, err := c.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Rollback(context.Background()) })
	if _, err := lock.Exec(ctx, "LOCK TABLE idemgate_tasks IN SHARE MODE"); err != nil {
		t.Fatalf("lock tasks: %v", err)
	}
	// Every action's first attempt goes to A, its retries to B.
	l := startLoad(t, 8, "node", func(attempt int) target {
		if attempt == 0 {
			return target{url: urlA, headers: c.auth}
		}
		return target{url: urlB, headers: c.auth}
	})
	// A's pool has fewer connections than clients: some handlers wait in
	// their INSERT, the others for a connection. All hold their claims.
	// Every client's first attempt is on its way to A before the kill, so
	// that the kill cuts off all eight, however slowly they got there.
	wait.For(t, patience, "every client's first attempt sent to A, and handlers on A held in their INSERT", func() bool {
		var n int
		c.db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%INSERT INTO idemgate_tasks%'`).Scan(&n)
		return n >= 2 && l.inFlightTo(urlA) == 8
	})
	kill(t, a)
	killed := time.Now()
	if err := lock.Commit(ctx); err != nil {
		t.Fatalf("unlock tasks: %v", err)
	}
	l.waitAccepted(t, 16)
	took := time.Since(killed)
	l.stop()

	retriedOnB := 0
	inProgress := 0
	for _, r := range l.since(killed) {
		if r.status == http.StatusConflict && r.code == string(idemgate.CodeRequestInProgress) {
			inProgress++
		}
	}
	l.mu.Lock()
	heldKeys := map[string]bool{}
	for _, r := range l.replies {
		if r.status == 0 && r.target == urlA && r.at.Before(killed) {
			heldKeys[r.key] = true
		}
	}
	for k := range heldKeys {
		if l.keys[k] != "" {
			retriedOnB++
		}
	}
	l.mu.Unlock()
	if retriedOnB < 8 {
		t.Errorf("%d actions cut off by the kill were then accepted by B, want ≥ 8", retriedOnB)
	}
	// The only other answers: transport errors from the killed node.
	checkReplies(t, l.since(time.Time{}), func(r reply) bool { return r.status == 0 && r.target == urlA })
	checkTasks(t, c.db, l, tenant)
	t.Logf("%d actions cut off on A were accepted by B after %v (the lease); %d answers 409 request_in_progress meanwhile",
		retriedOnB, took.Round(100*time.Millisecond), inProgress)
}

// taskRow is what the worker case watches of a task.
type taskRow struct {
	state    string
	attempt  int
	lockedBy string
	updated  time.Time
	results  string
}

func readTask(t *testing.T, db *pgxpool.Pool, id string) taskRow {
	t.Helper()
	var r taskRow
	err := db.QueryRow(context.Background(), `SELECT state, attempt, coalesce(locked_by, ''), updated_at, results::text
		FROM idemgate_tasks WHERE id = $1::uuid`, id).Scan(&r.state, &r.attempt, &r.lockedBy, &r.updated, &r.results)
	if err != nil {
		t.Fatalf("read task %s: %v", id, err)
	}
	return r
}

// submitOne submits one image task through an API node.
func submitOne(t *testing.T, url string, auth http.Header, key string) string {
	t.Helper()
	r := send(context.Background(), &http.Client{Timeout: 10 * time.Second}, target{url: url, headers: auth}, key, imageBody)
	if r.status != http.StatusAccepted || r.taskID == "" {
		t.Fatalf("submit %s: %v", key, r)
	}
	return r.taskID
}

// upstreamCalls counts the requests the example's stand-in upstream
// received for a task.
func upstreamCalls(t *testing.T, db *pgxpool.Pool, id string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM idemgate_example_upstream_calls WHERE ref = $1`, id).Scan(&n); err != nil {
		t.Fatalf("count upstream calls of %s: %v", id, err)
	}
	return n
}

// TestWorkerKilled SIGKILLs a worker process mid-task and freezes another
// (SIGSTOP) mid-task, each after its request reached the upstream. Image
// tasks are paid generations: a lost attempt becomes uncertain and a
// third worker reconciles it by asking the upstream, which never gets a
// second request. The killed worker's 10-minute generation is still
// running upstream, so its task stays uncertain; the frozen worker's 2s
// one is done, so its task succeeds on the same ID with the upstream's
// images. When the frozen worker wakes up, its stale completion is
// rejected and the tasks stay as the reconciler left them.
func TestWorkerKilled(t *testing.T) {
	t.Parallel()
	const tenant = "faults-worker-killed"
	c := newCluster(t, tenant)
	_, url := startServe(t, c.env)
	ctx := context.Background()

	sent := func(id string) func() bool {
		return func() bool { return readTask(t, c.db, id).state == "running" && upstreamCalls(t, c.db, id) == 1 }
	}
	// Worker 1 would take 10 minutes: it is killed mid-task.
	w1 := startProc(t, c.env, "worker", "-workers", "1", "-gen-time", "10m")
	id1 := submitOne(t, url, c.auth, "worker-killed-1")
	wait.For(t, patience, "task 1 running on worker 1, its request sent", sent(id1))
	// Worker 2 would finish in 2s: it is frozen before, and wakes long after.
	w2 := startProc(t, c.env, "worker", "-workers", "1", "-gen-time", "2s")
	id2 := submitOne(t, url, c.auth, "worker-killed-2")
	wait.For(t, patience, "task 2 running on worker 2, its request sent", sent(id2))
	if err := w2.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	kill(t, w1)
	before1, before2 := readTask(t, c.db, id1), readTask(t, c.db, id2)
	if before1.lockedBy == before2.lockedBy {
		t.Fatalf("both tasks on one worker (%s): the case needs one on each", before1.lockedBy)
	}
	stopped := time.Now()

	startProc(t, c.env, "worker", "-workers", "2", "-gen-time", "200ms")
	wait.For(t, patience, "task 2 reconciled to succeeded, task 1 uncertain", func() bool {
		return readTask(t, c.db, id2).state == "succeeded" && readTask(t, c.db, id1).state == "uncertain"
	})
	rescuedAfter := time.Since(stopped)
	after1, after2 := readTask(t, c.db, id1), readTask(t, c.db, id2)
	if after2.attempt != before2.attempt+1 {
		t.Errorf("task 2: attempt %d after the rescue, want %d (one reconcile, then done)", after2.attempt, before2.attempt+1)
	}
	if after2.results == "[]" || after2.results == "" {
		t.Errorf("task 2 succeeded without results")
	}
	for i, id := range []string{id1, id2} {
		if n := upstreamCalls(t, c.db, id); n != 1 {
			t.Errorf("task %d: %d upstream calls, want 1", i+1, n)
		}
	}

	if err := w2.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// Its 2s generation is long over: it tries to finish now, and is told
	// the task moved on.
	discarded := regexp.MustCompile(`the task moved on; outcome discarded.* task=` + regexp.QuoteMeta(id2) + `\b`)
	if _, err := w2.WaitOutput(discarded, patience); err != nil {
		t.Fatalf("the woken worker did not try to finish task 2: %v; its output:\n%s", err, w2.Output())
	}
	if got := readTask(t, c.db, id2); got != after2 {
		t.Errorf("the woken stale worker changed task 2: %+v, was %+v", got, after2)
	}
	if got := readTask(t, c.db, id1); got.state != "uncertain" || got.attempt < after1.attempt {
		t.Errorf("task 1 moved on while its upstream request still runs: %+v, was %+v", got, after1)
	}
	for i, id := range []string{id1, id2} {
		if n := upstreamCalls(t, c.db, id); n != 1 {
			t.Errorf("task %d: %d upstream calls after the stale worker woke, want 1", i+1, n)
		}
	}
	var n int
	c.db.QueryRow(ctx, `SELECT count(*) FROM idemgate_tasks`).Scan(&n)
	if n != 2 {
		t.Errorf("%d tasks, want 2", n)
	}
	t.Logf("reconciled %v after the kill; one upstream call per task; the woken worker's completion left the task unchanged", rescuedAfter.Round(100*time.Millisecond))
}
