package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
)

func TestOperatorListFilters(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	for i, tenant := range []string{"acme", "acme", "beta"} {
		nt := tenantTask(tenant, fmt.Sprintf("list-%d", i))
		if i == 1 {
			nt.Kind = "audio"
		}
		mustSubmit(t, s, nt)
	}
	failed := mustSubmit(t, s, tenantTask("beta", "list-failed"))
	if _, err := s.pool.Exec(ctx, "UPDATE idemgate_tasks SET state = 'failed', error = 'x' WHERE id = $1::uuid", failed.ID); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		given Filter
		want  []string // keys, newest first
	}{
		{name: "everything", given: Filter{}, want: []string{"list-failed", "list-2", "list-1", "list-0"}},
		{name: "by tenant", given: Filter{Tenant: "acme"}, want: []string{"list-1", "list-0"}},
		{name: "by kind", given: Filter{Kind: "audio"}, want: []string{"list-1"}},
		{name: "by state", given: Filter{State: StateFailed}, want: []string{"list-failed"}},
		{name: "all three", given: Filter{Tenant: "beta", Kind: "image", State: StatePending}, want: []string{"list-2"}},
		{name: "limited", given: Filter{Limit: 2}, want: []string{"list-failed", "list-2"}},
		{name: "nothing", given: Filter{Tenant: "nobody"}, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.Operator().List(ctx, tt.given)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(keysOf(got)) != fmt.Sprint(tt.want) {
				t.Fatalf("List(%+v) = %v; want %v", tt.given, keysOf(got), tt.want)
			}
		})
	}
	for _, bad := range []int{-1, MaxListLimit + 1} {
		if _, err := s.Operator().List(ctx, Filter{Limit: bad}); err == nil {
			t.Fatalf("List with limit %d: no error", bad)
		}
	}
}

// An operator reads and cancels any tenant's task by ID alone, and runs a
// failed task again on the same ID with its attempts reset.
func TestOperatorGetCancelRetry(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	op := s.Operator()
	task := mustSubmit(t, s, newTask("operator"))
	if got, err := op.Get(ctx, task.ID); err != nil || got.ID != task.ID {
		t.Fatalf("Get = %v, %v", got.ID, err)
	}
	if _, err := op.Get(ctx, "00000000-0000-0000-0000-000000000000"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of no task: %v; want ErrNotFound", err)
	}
	if _, err := op.Retry(ctx, task.ID); !errors.Is(err, ErrNotRecoverable) {
		t.Fatalf("Retry of a pending task: %v; want ErrNotRecoverable", err)
	}
	var attempts calls
	w := newWorker(t, s, WorkerConfig{MaxAttempts: 2, BackoffBase: 1, BackoffMax: 1,
		Handler: func(_ context.Context, t Task) Outcome {
			if attempts.add(t.ID) <= 2 {
				return Retry(0, errors.New("upstream down"))
			}
			return Succeeded(json.RawMessage(`1`))
		}})
	stop := runWorker(t, w)
	waitState(t, s, task.ID, StateFailed)
	retried, err := op.Retry(ctx, task.ID)
	if err != nil || retried.ID != task.ID || retried.State != StateRetrying || retried.Error != "" {
		t.Fatalf("Retry = %+v, %v; want the same task retrying", retried, err)
	}
	waitState(t, s, task.ID, StateSucceeded) // a fresh budget: attempt 3 of the task, try 1 of 2
	if n := attempts.get(task.ID); n != 3 {
		t.Fatalf("the handler ran %d times; want 3", n)
	}

	stop() // the next task stays pending for the operator
	other := mustSubmit(t, s, tenantTask("beta", "operator-cancel"))
	got, err := op.Cancel(ctx, other.ID)
	if err != nil || got.State != StateCancelled {
		t.Fatalf("Cancel = %s, %v; want cancelled", got.State, err)
	}
	if _, err := op.Cancel(ctx, task.ID); !errors.Is(err, ErrFinished) {
		t.Fatalf("Cancel of a succeeded task: %v; want ErrFinished", err)
	}
}

// Operator.Retry refuses every task that is not failed; List refuses a
// bad limit and an unknown state instead of answering "no tasks"; Retry
// and Cancel racing on one failed task end in one consistent state.
func TestOperatorRetryListEdges(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	op := s.Operator()
	ids := map[State]string{}
	for _, st := range []State{StatePending, StateRunning, StateSucceeded, StateCancelled, StateUncertain} {
		task := mustSubmit(t, s, newTask("op-"+string(st)))
		if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET state = $2 WHERE id = $1::uuid`, task.ID, st); err != nil {
			t.Fatal(err)
		}
		ids[st] = task.ID
	}
	for st, id := range ids {
		if _, err := op.Retry(ctx, id); !errors.Is(err, ErrNotRecoverable) {
			t.Errorf("Retry of a %s task: %v; want ErrNotRecoverable", st, err)
		}
		if got := state(t, s, id); got != st {
			t.Errorf("Retry of a %s task left it %s", st, got)
		}
	}
	for _, id := range []string{"", "not-a-uuid", "00000000-0000-0000-0000-000000000000", "'; DROP TABLE idemgate_tasks; --"} {
		if _, err := op.Retry(ctx, id); !errors.Is(err, ErrNotFound) {
			t.Errorf("Retry(%q): %v; want ErrNotFound", id, err)
		}
	}
	for _, l := range []int{-1, MaxListLimit + 1, 1 << 40} {
		if _, err := op.List(ctx, Filter{Limit: l}); err == nil {
			t.Errorf("List limit %d: no error", l)
		}
	}
	if got, err := op.List(ctx, Filter{State: "done"}); err == nil {
		t.Errorf("List of unknown state %q: %d tasks, no error; a typo reads as an empty queue", "done", len(got))
	}
	// Retry racing Cancel on a failed task, many times.
	for i := range 30 {
		task := mustSubmit(t, s, newTask("race-"+string(rune('a'+i))))
		if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'failed', error = 'x', finished_at = now()
			WHERE id = $1::uuid`, task.ID); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var rerr, cerr error
		var cgot Task
		wg.Go(func() { _, rerr = op.Retry(ctx, task.ID) })
		wg.Go(func() { cgot, cerr = op.Cancel(ctx, task.ID) })
		wg.Wait()
		final := state(t, s, task.ID)
		switch {
		case rerr != nil && final != StateFailed:
			t.Errorf("Retry failed (%v) but the task is %s", rerr, final)
		case cerr == nil && cgot.State == StateCancelled && final != StateCancelled:
			t.Errorf("Cancel said cancelled but the task is %s", final)
		case final != StateRetrying && final != StateCancelled && final != StateFailed:
			t.Errorf("task ended %s", final)
		}
	}
}
