package pgstore

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A database that holds the heartbeat up (the task's row is locked past
// the lease) confirms nothing: the attempt is cancelled by its own local
// deadline, and the task, released by the attempt's lost policy once the
// lock is gone, ran once.
func TestHeartbeatHeldUpPastTheLease(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	var c calls
	cause := make(chan error, 1)
	entered := make(chan struct{})
	// A lease of 5 s, not 1: with 1 s, a claim whose handler started more
	// than a second late on a loaded machine lost its lease before the
	// handler ran, the task went uncertain, and the test waited for ever
	// for a handler (make test's 20-minute timeout, in a clean-clone run).
	w := newWorker(t, s, WorkerConfig{Lease: 5 * time.Second, Heartbeat: 200 * time.Millisecond, RescueInterval: 50 * time.Millisecond,
		Policies: map[string]KindPolicy{"image": {Lost: LostUncertain}},
		Handler: func(ctx context.Context, t Task) Outcome {
			if c.add(t.ID) == 1 {
				close(entered)
			}
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return Retry(0, ctx.Err())
		}})
	runWorker(t, w)
	task := mustSubmit(t, s, newTask("held-heartbeat"))
	waitEntered(t, s, entered)
	ctx := context.Background()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT FROM idemgate_tasks WHERE id = $1::uuid FOR UPDATE", task.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-cause:
		if !errors.Is(err, errLeaseExpired) {
			t.Fatalf("handler's context ended by %v; want the local lease deadline", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the attempt ran on with its lease unconfirmed")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitState(t, s, task.ID, StateUncertain)
	if n := c.get(task.ID); n != 1 {
		t.Fatalf("handler ran %d times; want once", n)
	}
}
