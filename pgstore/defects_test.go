package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defect 1: a panic in Reconcile must leave the task uncertain; it never
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
	waitFor(t, func() bool { return panics.Load() >= 3 })
	if n := c.get(task.ID); n != 1 {
		t.Fatalf("the handler ran %d times; an uncertain task must never run again by itself", n)
	}
	if st := state(t, s, task.ID); st != StateUncertain {
		t.Fatalf("task is %s after Reconcile panicked; want uncertain", st)
	}
}

// Defect 3: a worker that still runs a stale attempt of a task must not
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
	w := newWorker(t, s, WorkerConfig{Lease: time.Hour, Heartbeat: 20 * time.Millisecond, PollInterval: 10 * time.Millisecond,
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
	<-entered
	ctx1 := <-firstCtx
	// Another worker's rescuer requeued the task (the lease looked expired).
	if _, err := s.pool.Exec(context.Background(), `UPDATE idemgate_tasks SET state = 'retrying', run_after = now(),
		lease_until = NULL WHERE id = $1::uuid`, task.ID); err != nil {
		t.Fatal(err)
	}
	if !eventually(func() bool { return ctx1.Err() != nil }) {
		t.Fatalf("the stale attempt's context was never cancelled (handler ran %d times)", c.get(task.ID))
	}
	claims := w.claims.Load()
	waitFor(t, func() bool { return w.claims.Load() >= claims+3 })
	if n := c.get(task.ID); n != 1 || overlap.Load() != 0 {
		t.Fatalf("the worker ran the task %d times (%d overlapping) while its stale attempt ran", n, overlap.Load())
	}
	close(unblock)
	<-secondDone
	waitState(t, s, task.ID, StateSucceeded)
	if got := mustGet(t, s, task); got.Attempt != 2 || string(got.Results[0]) != `"second"` {
		t.Fatalf("task %+v; want the second attempt's success", got)
	}
}

// Defect 4: outcomes Postgres refuses as such (NUL in text, \u0000 in
// jsonb) are stored sanitized, once; the task does not run again.
func TestOutcomesPostgresRefusesAreRecorded(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	var c calls
	w := newWorker(t, s, WorkerConfig{Lease: 500 * time.Millisecond, Heartbeat: 100 * time.Millisecond,
		RescueInterval: 50 * time.Millisecond, MaxAttempts: 2, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
		Handler: func(ctx context.Context, t Task) Outcome {
			c.add(t.ID)
			switch t.IdempotencyKey {
			case "nul-error":
				return Failed(errors.New("upstream said \x00 bad \xff bytes"))
			case "nul-retry":
				return Retry(time.Hour, errors.New("busy\x00"))
			default:
				return Succeeded(json.RawMessage(`{"text":"a\u0000b","bad":"\ud800"}`))
			}
		}})
	runWorker(t, w)
	failed := mustSubmit(t, s, newTask("nul-error"))
	retried := mustSubmit(t, s, newTask("nul-retry"))
	succeeded := mustSubmit(t, s, newTask("nul-result"))
	waitState(t, s, failed.ID, StateFailed)
	waitState(t, s, retried.ID, StateRetrying)
	waitState(t, s, succeeded.ID, StateSucceeded)
	for _, task := range []Task{failed, retried, succeeded} {
		if n := c.get(task.ID); n != 1 {
			t.Errorf("task %s ran %d times; want once", task.IdempotencyKey, n)
		}
	}
	if got := mustGet(t, s, failed); !strings.Contains(got.Error, "upstream said") || !strings.Contains(got.Error, "bad") {
		t.Errorf("failed task's error %q; want the handler's error, sanitized", got.Error)
	}
	if got := mustGet(t, s, retried); !strings.Contains(got.Error, "busy") {
		t.Errorf("retried task's error %q; want the handler's error, sanitized", got.Error)
	}
	got := mustGet(t, s, succeeded)
	var item struct{ Text, Bad string }
	if len(got.Results) != 1 || json.Unmarshal(got.Results[0], &item) != nil || !strings.HasPrefix(item.Text, "a") || !strings.HasSuffix(item.Text, "b") {
		t.Errorf("succeeded task's results %s; want the item, sanitized", got.Results)
	}
}

// Defect 5: a migration rerun in schema a must not touch schema b, even
// when search_path reaches b.
func TestMigrateRerunStaysInItsSchema(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin := db.pool(t)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA a; CREATE SCHEMA b"); err != nil {
		t.Fatal(err)
	}
	inSchema := func(path string) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(db.dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["search_path"] = path
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	// b is at v1: its narrow index is its only uniqueness boundary.
	b := newStore(inSchema("b"))
	b.test = &storeTestHooks{migrateSkip: []int{2, 3, 4}}
	if err := b.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// a migrates with b on its search_path and dies after dropping its
	// own narrow index, before recording v2.
	a := newStore(inSchema("a, b"))
	a.test = &storeTestHooks{migrateStep: func(_ context.Context, step string, pid uint32) {
		if step == "v2: record" {
			terminate(t, admin, pid)
		}
	}}
	if err := a.Migrate(ctx); err == nil {
		t.Fatal("Migrate succeeded on a killed connection")
	}
	a.test = nil
	if err := a.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var narrowInB bool
	if err := admin.QueryRow(ctx, `SELECT to_regclass('b.idemgate_tasks_key_v1') IS NOT NULL`).Scan(&narrowInB); err != nil {
		t.Fatal(err)
	}
	if !narrowInB {
		t.Fatal("the rerun in schema a dropped schema b's unique index")
	}
}

// Defect 7b: a task announced by no NOTIFY of its own (its Submit fell in
// a burst's rate-limit window) is claimed a recheck window after the
// burst's last notification, not at the next poll.
func TestNoLostWakeUpAfterABurst(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	w := newWorker(t, s, WorkerConfig{PollInterval: time.Hour, Handler: func(context.Context, Task) Outcome {
		return Succeeded(json.RawMessage(`1`))
	}})
	// A wide window, so that the sleeps below can overrun a lot.
	const window = 2 * time.Second
	w.listener.recheck = window
	runWorker(t, w)
	waitFor(t, func() bool {
		return countActivity(t, s.pool, listening) == 1 && w.claims.Load() >= 2
	})
	ctx := context.Background()
	notify := func() {
		if _, err := s.pool.Exec(ctx, "SELECT pg_notify($1, 'image')", notifyChannel); err != nil {
			t.Fatal(err)
		}
	}
	// The quiet task must commit after the first notification's recheck
	// and before the last one's. A loaded machine can overrun the sleeps
	// past the last recheck; such an attempt proves nothing and is run
	// again (its task is claimed by the next attempt's notifications).
	for attempt := 1; ; attempt++ {
		notify()
		time.Sleep(window / 2)
		last := time.Now()
		notify() // the burst's last announcement
		time.Sleep(window/2 + window/6)
		var id string
		if err := s.pool.QueryRow(ctx, `INSERT INTO idemgate_tasks
			(tenant, owner, kind, runtime, network, idempotency_key, fingerprint)
			VALUES ('acme', 'o', 'image', 'gpu', 'main', $1, 'f') RETURNING id::text`,
			fmt.Sprintf("quiet-%d", attempt)).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if late := time.Since(last); late >= window {
			if attempt == 5 {
				t.Skipf("the machine overran every attempt's sleeps (last by %v); nothing was shown", late-window)
			}
			t.Logf("attempt %d: the insert landed %v after the last notification's recheck; again", attempt, late-window)
			continue
		}
		// The recheck is due within window; the poll interval is an hour.
		deadline := time.Now().Add(time.Minute)
		for state(t, s, id) != StateSucceeded {
			if time.Now().After(deadline) {
				t.Fatal("the task waited for the poll interval: a wake-up was lost")
			}
			time.Sleep(10 * time.Millisecond)
		}
		return
	}
}

// Defect 8: with a backlog of another kind ahead, a claim for one kind
// reads about as much as without it.
func TestClaimIgnoresOtherKindsBacklog(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	mustSubmit(t, s, newTask("the-image"))
	before := claimBuffers(t, s, []string{"image"})
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after)
		SELECT 'acme', 'o', 'video', 'gpu', 'main', 'video-' || g, 'f', now() - interval '1 hour'
		FROM generate_series(1, 50000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, "ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
	for _, kinds := range [][]string{{"image"}, {"audio", "image"}} {
		after := claimBuffers(t, s, kinds)
		t.Logf("claim %v buffers: %d without the backlog, %d with 50k video tasks ahead", kinds, before, after)
		if after > 2*before+8 {
			t.Fatalf("the claim of %v read %d buffers with another kind's backlog ahead, %d without", kinds, after, before)
		}
	}
}

// claimBuffers runs the worker's claim for kinds under EXPLAIN (ANALYZE,
// BUFFERS) in a transaction it rolls back, and returns the buffers it
// touched.
func claimBuffers(t testing.TB, s *Store, kinds []string) int {
	t.Helper()
	ctx := context.Background()
	w := newWorker(t, s, WorkerConfig{Kinds: kinds, Handler: func(context.Context, Task) Outcome { return Outcome{} }})
	sql, args := w.claimStatement(1)
	var total int
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var plan []map[string]any
		if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args).Scan(&plan); err != nil {
			return err
		}
		top := plan[0]["Plan"].(map[string]any)
		total = int(top["Shared Hit Blocks"].(float64) + top["Shared Read Blocks"].(float64))
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	return total
}

var errRollback = errors.New("roll back")
