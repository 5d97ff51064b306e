//go:build review

package pgstore

import (
	"context"
	"errors"
	"sync"
	"testing"
)

// Operator.Retry refuses every task that is not failed; List refuses a
// bad limit and an unknown state instead of answering "no tasks"; Retry
// and Cancel racing on one failed task end in one consistent state.
func TestReviewOperatorRetryListEdges(t *testing.T) {
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
