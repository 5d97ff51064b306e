package pgstore

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/wait"
)

// The claim loop and a Reconcile's claim, running at once in one worker,
// never take the same free slots: a worker of Concurrency 2 runs at most
// 2 handlers and Reconciles at once. The claim loop, having read its free
// slots, waits (a test hook) until a Reconcile's claim has had its chance;
// without a reservation of the slots, both claimed 2 (4 at once).
func TestReconcileAndClaimShareTheFreeSlots(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	var live, most atomic.Int64
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	run := func(ctx context.Context, _ Task) Outcome {
		n := live.Add(1)
		defer live.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		select {
		case <-ctx.Done():
		case <-hold:
		}
		return Succeeded(json.RawMessage(`1`))
	}
	w := newWorker(t, s, WorkerConfig{Concurrency: 2, RescueInterval: 10 * time.Millisecond,
		ReconcileInterval: time.Millisecond, Handler: run, Reconcile: run})
	var armed, claimed atomic.Bool
	uncertain := make([]Task, 2)
	for i := range uncertain {
		uncertain[i] = uncertainTask(t, s, "uncertain-"+string(rune('a'+i)))
	}
	// Not due until the claim loop has read its slots.
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET run_after = now() + interval '1 hour' WHERE state = 'uncertain'`); err != nil {
		t.Fatal(err)
	}
	w.test = &workerTestHooks{claiming: func() {
		if !armed.Load() || claimed.Swap(true) {
			return
		}
		if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET run_after = now() WHERE state = 'uncertain'`); err != nil {
			t.Error(err)
			return
		}
		// The Reconcile's claim takes whatever it can meanwhile: with the
		// slots reserved, nothing.
		wait.Until(2*time.Second, func() bool { return len(w.attempts.reconciling()) > 0 })
	}}
	runWorker(t, w)
	armed.Store(true)
	for _, key := range []string{"run-a", "run-b"} {
		mustSubmit(t, s, newTask(key))
	}
	wait.For(t, patience, "the claim loop claimed", func() bool { return claimed.Load() && w.count() >= 2 })
	wait.For(t, patience, "the claim's attempts registered", func() bool {
		w.attempts.mu.Lock()
		defer w.attempts.mu.Unlock()
		return w.attempts.claiming == 0
	})
	if n := w.count(); n > 2 {
		t.Fatalf("%d attempts in a worker of Concurrency 2", n)
	}
	if m := most.Load(); m > 2 {
		t.Fatalf("%d handlers and Reconciles ran at once in a worker of Concurrency 2", m)
	}
}
