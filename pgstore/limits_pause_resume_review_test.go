//go:build review

package pgstore

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"
)

// Paused holds back every start of a handler of the kind: a first
// attempt, a due retry and a due Reconcile; Submit still accepts. Resume
// wakes the workers by notification, not at their next poll (10 s here).
func TestReviewPauseHoldsRetriesAndReconcilesResumeWakesPromptly(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	if err := s.SetKindLimits(ctx, "image", KindLimits{Paused: true}); err != nil {
		t.Fatal(err)
	}
	fresh := mustSubmit(t, s, newTask("fresh"))
	retry := mustSubmit(t, s, newTask("retry"))
	unc := mustSubmit(t, s, newTask("uncertain"))
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'retrying', attempt = 1, tries = 1
		WHERE id = $1::uuid`, retry.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'uncertain', attempt = 1, tries = 1
		WHERE id = $1::uuid`, unc.ID); err != nil {
		t.Fatal(err)
	}
	var starts atomic.Int64
	h := func(context.Context, Task) Outcome { starts.Add(1); return Succeeded(json.RawMessage(`1`)) }
	w := newWorker(t, s, WorkerConfig{Concurrency: 4, Handler: h, Reconcile: h,
		PollInterval: 10 * time.Second, RescueInterval: 50 * time.Millisecond})
	runWorker(t, w)
	time.Sleep(time.Second)
	if n := starts.Load(); n != 0 {
		t.Fatalf("%d handlers or Reconciles started while paused", n)
	}
	if _, err := s.Submit(ctx, newTask("while-paused")); err != nil {
		t.Fatalf("Submit while paused: %v", err)
	}
	resumed := time.Now()
	if err := s.SetKindLimits(ctx, "image", KindLimits{}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{fresh.ID, retry.ID, unc.ID} {
		waitState(t, s, id, StateSucceeded)
	}
	took := time.Since(resumed)
	t.Logf("all ran %v after resume", took)
	if took > 2*time.Second {
		t.Fatalf("resume took %v to take effect; the poll interval is 10s, a notification should wake at once", took)
	}
}
