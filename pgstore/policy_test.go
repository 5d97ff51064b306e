package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/wait"
)

// A handler blocked upstream is ended by its kind's Timeout,
// without waiting for it, as its kind's Lost policy says.
func TestTimeoutEndsTheAttempt(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		lost      LostPolicy
		wantState State
	}{
		{name: "retry policy", lost: LostRetry, wantState: StateRetrying},
		{name: "uncertain policy", lost: LostUncertain, wantState: StateUncertain},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, _ := setup(t)
			unblock := make(chan struct{})
			defer close(unblock)
			var got events
			var c calls
			w := newWorker(t, s, WorkerConfig{OnEvent: got.add, Heartbeat: 50 * time.Millisecond,
				BackoffBase: time.Hour, ReconcileInterval: time.Hour,
				Policies: map[string]KindPolicy{"image": {Timeout: 200 * time.Millisecond, Lost: tt.lost}},
				Handler: func(ctx context.Context, t Task) Outcome {
					c.add(t.ID)
					<-unblock // blocked upstream, deaf to its context
					return Succeeded(json.RawMessage(`"never"`))
				}})
			runWorker(t, w)
			task := mustSubmit(t, s, newTask("blocked"))
			waitState(t, s, task.ID, tt.wantState)
			g := mustGet(t, s, task)
			if !strings.Contains(g.Error, "timed out") || c.get(task.ID) != 1 {
				t.Fatalf("task %s %q after %d runs; want it timed out after one", g.State, g.Error, c.get(task.ID))
			}
			wait.For(t, patience, "the claim and the end of the attempt reported", func() bool { return len(got.of(task.ID)) == 2 })
			if evs := got.of(task.ID); evs[1] != WorkerTimedOut {
				t.Fatalf("events %v; want claimed, timed_out", evs)
			}
			if p := Project(g); p.PollAfter <= 0 {
				t.Fatalf("projection %+v; want keep polling", p)
			}
		})
	}
}

// An attempt cut off by lease expiry or shutdown goes where
// its kind's policy says; with uncertain + reconcile the handler, which
// may have called the upstream, never runs again.
func TestLostAttemptFollowsTheKindPolicy(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		lost      LostPolicy
		crash     bool  // the worker dies (lease expires) instead of shutting down
		wantState State // right after the loss
		wantRuns  int   // handler runs in all
	}{
		{name: "expired lease, retry", lost: LostRetry, crash: true, wantState: StateSucceeded, wantRuns: 2},
		{name: "expired lease, uncertain", lost: LostUncertain, crash: true, wantState: StateSucceeded, wantRuns: 1},
		{name: "released at shutdown, retry", lost: LostRetry, wantState: StateSucceeded, wantRuns: 2},
		{name: "released at shutdown, uncertain", lost: LostUncertain, wantState: StateSucceeded, wantRuns: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, _ := setup(t)
			var c, reconciled calls
			entered, unblock := make(chan struct{}), make(chan struct{})
			handler := func(ctx context.Context, t Task) Outcome {
				if c.add(t.ID) == 1 {
					close(entered)
					if tt.crash {
						<-unblock // a dead process's handler writes nothing
					} else {
						// Shutdown cancels it; the release is written
						// once it returned.
						select {
						case <-ctx.Done():
						case <-unblock:
						}
					}
					return Retry(0, errors.New("interrupted"))
				}
				return Succeeded(json.RawMessage(`"ran again"`))
			}
			shutdown := 100 * time.Millisecond
			if !tt.crash {
				// The handler returns as soon as shutdown cancels it, but
				// Run's last wait (ShutdownTimeout/2) must also cover that
				// return and the release's write on a loaded machine:
				// otherwise Run leaves the task to its lease, which no
				// worker rescues before the test starts the second one.
				shutdown = 4 * time.Second
			}
			// A lease a loaded machine's claim cannot outlast: a claim
			// slower than the lease (seen: 530 ms under -race beside the
			// other cases) rightly never starts its handler ("lease not
			// confirmed in time"), which is not what this test is about.
			cfg := WorkerConfig{Handler: handler, Lease: 2 * time.Second, Heartbeat: 400 * time.Millisecond,
				RescueInterval: 50 * time.Millisecond, ReconcileInterval: 10 * time.Millisecond,
				BackoffBase: time.Millisecond, BackoffMax: time.Millisecond, ShutdownTimeout: shutdown,
				Policies: map[string]KindPolicy{"image": {Lost: tt.lost}},
				Reconcile: func(ctx context.Context, t Task) Outcome {
					reconciled.add(t.ID)
					return Succeeded(json.RawMessage(`"the upstream had it"`))
				}}
			var evA events
			cfgA := cfg
			cfgA.OnEvent = evA.add
			a := newWorker(t, s, cfgA)
			if tt.crash {
				a.test = &workerTestHooks{crashOnStop: true}
			}
			stopA := runWorker(t, a)
			task := mustSubmit(t, s, newTask("lost"))
			select {
			case <-entered:
			case <-time.After(patience):
				g := mustGet(t, s, task)
				t.Fatalf("task %s: the first worker never started its handler (state %s, attempt %d, err %q, events %+v)", task.ID, g.State, g.Attempt, g.Error, evA.all)
			}
			if tt.crash {
				stopA() // dies: no heartbeats, no release
			} else {
				go stopA() // shuts down: releases the task after ShutdownTimeout
				wait.For(t, patience, "the task left running", func() bool { return state(t, s, task.ID) != StateRunning })
			}
			runWorker(t, newWorker(t, s, cfg))
			waitState(t, s, task.ID, tt.wantState)
			close(unblock)
			if n := c.get(task.ID); n != tt.wantRuns {
				t.Fatalf("handler ran %d times; want %d", n, tt.wantRuns)
			}
			if tt.lost == LostUncertain && reconciled.get(task.ID) != 1 {
				t.Fatalf("reconciled %d times; want once", reconciled.get(task.ID))
			}
		})
	}
}

func TestNewWorkerCopiesItsConfig(t *testing.T) {
	t.Parallel()
	s := newStore(nil)
	policies := map[string]KindPolicy{"image": {Lost: LostUncertain}}
	kinds := []string{"image"}
	w, err := NewWorker(s, WorkerConfig{Handler: func(context.Context, Task) Outcome { return Outcome{} }, Policies: policies, Kinds: kinds})
	if err != nil {
		t.Fatal(err)
	}
	policies["image"] = KindPolicy{Lost: LostRetry}
	kinds[0] = "video"
	if p := w.cfg.policy("image"); p.Lost != LostUncertain || p.Timeout != DefaultTimeout {
		t.Fatalf("policy = %+v; want the one given at construction, with the default timeout", p)
	}
	if w.cfg.Kinds[0] != "image" {
		t.Fatalf("kinds = %v; want a copy", w.cfg.Kinds)
	}
	for _, bad := range []WorkerConfig{
		{Policies: map[string]KindPolicy{"image": {Lost: "maybe"}}},
		{Policies: map[string]KindPolicy{"image": {Timeout: -time.Second}}},
		{Lease: time.Second, Heartbeat: 900 * time.Millisecond},
	} {
		bad.Handler = func(context.Context, Task) Outcome { return Outcome{} }
		if _, err := NewWorker(s, bad); err == nil {
			t.Errorf("NewWorker(%+v) accepted a bad config", bad)
		}
	}
	if _, err := NewWorker(s, WorkerConfig{Lease: 2 * time.Second, Heartbeat: 400 * time.Millisecond,
		Handler: func(context.Context, Task) Outcome { return Outcome{} }}); err != nil {
		t.Fatalf("a 2s lease with a 400ms heartbeat: %v", err)
	}
}
