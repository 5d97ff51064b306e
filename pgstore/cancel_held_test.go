package pgstore

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/wait"
)

// uncertainTask submits a task and makes it uncertain, due for a
// Reconcile now.
func uncertainTask(t *testing.T, s *Store, key string) Task {
	t.Helper()
	nt := newTask(key)
	nt.RunAfter = time.Now().Add(time.Hour)
	task := mustSubmit(t, s, nt)
	if _, err := s.pool.Exec(context.Background(), `UPDATE idemgate_tasks SET state = 'uncertain', attempt = 1,
	tries = 1, lost = 'uncertain', run_after = now() WHERE id = $1::uuid`, task.ID); err != nil {
		t.Fatal(err)
	}
	return task
}

// Cancelling an uncertain task while its Reconcile runs ends the task
// cancelled, whatever the Reconcile returns: its Succeeded, written after
// the cancellation, must not overwrite it. With the cancellation's
// notification missed, the Reconcile returns its answer before it learns
// of the cancel, and only the write's respect for the task's state stands
// between the answer and the cancel (seen failing with a finish that
// ignored the task's state). Until the Reconcile returned, the task shows
// cancelled to readers, and its kind's limits still count it.
func TestCancelDuringReconcileEndsCancelled(t *testing.T) {
	t.Parallel()
	for _, missed := range []bool{false, true} {
		name := "notified"
		if missed {
			name = "notification missed"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, _ := setup(t)
			ctx := context.Background()
			var ev events
			entered, proceed := make(chan struct{}), make(chan struct{})
			w := newWorker(t, s, WorkerConfig{ReconcileInterval: time.Millisecond, RescueInterval: 20 * time.Millisecond,
				OnEvent: ev.add,
				Handler: func(context.Context, Task) Outcome { return Failed(nil) },
				Reconcile: func(ctx context.Context, _ Task) Outcome {
					close(entered)
					if !missed {
						<-ctx.Done() // told of the cancel, it winds down until proceed
					}
					<-proceed // missed: answers without having seen a cancelled ctx
					return Succeeded(json.RawMessage(`"upstream said done"`))
				}})
			if missed {
				w.listener.cancel = func(string) {} // and the heartbeat is 10 s away
			}
			task := uncertainTask(t, s, "reconciled")
			runWorker(t, w)
			<-entered
			got, err := s.Cancel(ctx, task.Tenant, task.Owner, task.ID)
			if err != nil || got.State != StateCancelled {
				t.Fatalf("Cancel = %s, %v; want cancelled", got.State, err)
			}
			if g := mustGet(t, s, task); g.State != StateCancelled {
				t.Fatalf("Get after Cancel: %s; want cancelled", g.State)
			}
			if n := countRows(t, s.pool, "id = $1::uuid AND state = 'uncertain' AND run_after > now() AND locked_by IS NOT NULL", task.ID); n != 1 {
				t.Fatal("the cancelled task's Reconcile claim was dropped while the Reconcile ran: its kind's limits no longer count it")
			}
			close(proceed)
			wait.For(t, patience, "the Reconcile's end written", func() bool {
				return countRows(t, s.pool, "id = $1::uuid AND state <> 'uncertain'", task.ID) == 1
			})
			g := mustGet(t, s, task)
			if g.State != StateCancelled || len(g.Results) != 0 || g.Error != "cancelled" {
				t.Fatalf("task is %s (results %s, error %q) after the Reconcile returned; want cancelled, no results",
					g.State, g.Results, g.Error)
			}
			if st := state(t, s, task.ID); st != StateCancelled {
				t.Fatalf("row state %s; want cancelled", st)
			}
			wait.For(t, patience, "the cancel reported", func() bool { return slices.Contains(ev.of(task.ID), WorkerCancelled) })
		})
	}
}

// A running task cancelled while its worker is gone (a crash: no write
// ever comes) keeps its lease, counted against its kind's limits, until
// the lease ends; then a rescue ends it cancelled, not retried.
func TestCancelledTaskOfADeadWorkerEndsAtItsLease(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	entered, hung := make(chan struct{}, 1), make(chan struct{})
	t.Cleanup(func() { close(hung) })
	// 5 s: the lease must outlast the steps up to the check below on a
	// loaded machine.
	dead := newWorker(t, s, WorkerConfig{Name: "dead", Lease: 5 * time.Second, Heartbeat: time.Second,
		Handler: func(context.Context, Task) Outcome {
			entered <- struct{}{}
			<-hung // a dead process's handler never returns, nor writes
			return Succeeded(json.RawMessage(`1`))
		}})
	dead.test = &workerTestHooks{crashOnStop: true}
	dead.listener.cancel = func(string) {} // the crash comes before the notification
	stop := runWorker(t, dead)
	task := mustSubmit(t, s, newTask("dead"))
	waitEntered(t, s, entered)
	stop() // crashOnStop: nothing more is written
	if _, err := s.Cancel(ctx, task.Tenant, task.Owner, task.ID); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, s.pool, "id = $1::uuid AND state = 'running' AND lease_until > now()", task.ID); n != 1 {
		t.Fatal("Cancel dropped the lease of an attempt that may still run")
	}
	rescuer := newWorker(t, s, WorkerConfig{Name: "rescuer", RescueInterval: 20 * time.Millisecond,
		Handler: func(context.Context, Task) Outcome { return Succeeded(json.RawMessage(`1`)) }})
	runWorker(t, rescuer)
	waitState(t, s, task.ID, StateCancelled)
	if g := mustGet(t, s, task); g.Attempt != 1 || g.Error != "cancelled" {
		t.Fatalf("task attempt %d error %q; want cancelled at attempt 1, not run again", g.Attempt, g.Error)
	}
}

// Operator.List finds a task cancelled while its attempt stops by the
// state it shows, cancelled.
func TestListShowsCancelledWhileTheAttemptStops(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	task := mustSubmit(t, s, newTask("held"))
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'running', attempt = 1,
	lease_until = now() + interval '1 hour' WHERE id = $1::uuid`, task.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Operator().Cancel(ctx, task.ID); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		state State
		want  int
	}{{StateCancelled, 1}, {StateRunning, 0}} {
		got, err := s.Operator().List(ctx, Filter{State: tt.state})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != tt.want {
			t.Errorf("List(%s) = %d tasks; want %d", tt.state, len(got), tt.want)
		}
	}
	if st := state(t, s, task.ID); st != StateRunning {
		t.Fatalf("row state %s; want running: the attempt holds it until it stops", st)
	}
}
