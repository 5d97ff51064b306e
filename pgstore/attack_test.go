package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Attacks on the worker, as a hostile environment or a careless handler
// would make them. Each checks one promise: a task is never run again by
// accident, an outcome is never lost, a worker never stops working.

// panicError is an error whose Error method panics, as a typed nil
// pointer's does.
type panicError struct{ msg *string }

func (e *panicError) Error() string { return *e.msg }

// A handler's error whose Error method panics (a typed nil) must not
// take the worker down: the outcome is recorded with a text saying so.
func TestAttackHandlerErrorThatPanics(t *testing.T) {
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
func TestAttackHandlerGoexit(t *testing.T) {
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

// Results Postgres cannot hold however they are escaped (nested deeper
// than its parser goes) are recorded as a failure, once.
func TestAttackDeeplyNestedResults(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	var c calls
	const depth = 9000 // json.Valid allows 10000
	deep := json.RawMessage(strings.Repeat("[", depth) + strings.Repeat("]", depth))
	if !json.Valid(deep) {
		t.Fatal("the test's JSON is not valid")
	}
	w := newWorker(t, s, WorkerConfig{MaxAttempts: 3, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
		Handler: func(ctx context.Context, t Task) Outcome {
			c.add(t.ID)
			return Succeeded(deep)
		}})
	runWorker(t, w)
	task := mustSubmit(t, s, newTask("deep"))
	if !eventually(func() bool { st := state(t, s, task.ID); return st == StateSucceeded || st == StateFailed }) {
		t.Fatalf("task is %s; want it finished", state(t, s, task.ID))
	}
	if n := c.get(task.ID); n != 1 {
		t.Fatalf("handler ran %d times; want once", n)
	}
	t.Logf("deep results ended %s: %q", state(t, s, task.ID), mustGet(t, s, task).Error)
}

// Cancel while the worker's LISTEN connection is gone: the notification
// is lost, and the heartbeat, which finds the task no longer running,
// still stops the attempt; the late success does not apply.
func TestAttackCancelWhileListenIsDown(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	cause := make(chan error, 1)
	entered := make(chan struct{})
	var reconnects atomic.Int64
	w := newWorker(t, s, WorkerConfig{Lease: 3 * time.Second, Heartbeat: 200 * time.Millisecond, PollInterval: 20 * time.Millisecond,
		Handler: func(ctx context.Context, t Task) Outcome {
			close(entered)
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return Succeeded(json.RawMessage(`"too late"`))
		}})
	runWorker(t, w)
	waitFor(t, func() bool { return countActivity(t, s.pool, listening) == 1 })
	task := mustSubmit(t, s, newTask("cancel-unheard"))
	<-entered
	// Cut the listener off and cancel before it can listen again (it
	// waits at least 100ms before reconnecting).
	if _, err := s.pool.Exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "+listening); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Cancel(context.Background(), task.Tenant, task.Owner, task.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-cause:
		if !errors.Is(err, errLeaseLost) && !errors.Is(err, errCancelled) {
			t.Fatalf("handler's context ended by %v; want the lost lease (or the cancel)", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the running attempt was not stopped")
	}
	waitFor(t, func() bool {
		reconnects.Store(int64(countActivity(t, s.pool, listening)))
		return reconnects.Load() == 1
	})
	if g := mustGet(t, s, task); g.State != StateCancelled || len(g.Results) != 0 {
		t.Fatalf("task %s with results %s; the late success must not apply", g.State, g.Results)
	}
}

// A database that holds the heartbeat up (the task's row is locked past
// the lease) confirms nothing: the attempt is cancelled by its own local
// deadline, and the task, released by the attempt's lost policy once the
// lock is gone, ran once.
func TestAttackHeartbeatHeldUpPastTheLease(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	var c calls
	cause := make(chan error, 1)
	entered := make(chan struct{})
	w := newWorker(t, s, WorkerConfig{Lease: time.Second, Heartbeat: 100 * time.Millisecond, RescueInterval: 50 * time.Millisecond,
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
	<-entered
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
