package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/wait"
)

func TestCancel(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	tests := []struct {
		name      string
		given     string // SQL SET clause on a fresh task; "" leaves it pending
		owner     string // "" is the task's owner
		id        string // "" is the task's ID
		wantErr   error
		wantState State
	}{
		{name: "pending", wantState: StateCancelled},
		{name: "retrying", given: "state = 'retrying'", wantState: StateCancelled},
		{name: "uncertain", given: "state = 'uncertain'", wantState: StateCancelled},
		{name: "running", given: "state = 'running', attempt = 1", wantState: StateCancelled},
		{name: "cancelled again changes nothing", given: "state = 'cancelled'", wantState: StateCancelled},
		{name: "succeeded is left alone", given: "state = 'succeeded', results = '[1]'", wantErr: ErrFinished, wantState: StateSucceeded},
		{name: "failed is left alone", given: "state = 'failed', error = 'x'", wantErr: ErrFinished, wantState: StateFailed},
		{name: "another owner's task", owner: "someone-else", wantErr: ErrNotFound},
		{name: "no such task", id: "00000000-0000-0000-0000-000000000000", wantErr: ErrNotFound},
		{name: "not an ID", id: "x'; DROP TABLE idemgate_tasks; --", wantErr: ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			task := mustSubmit(t, s, newTask("cancel-"+tt.name))
			if tt.given != "" {
				if _, err := s.pool.Exec(ctx, "UPDATE idemgate_tasks SET "+tt.given+" WHERE id = $1::uuid", task.ID); err != nil {
					t.Fatal(err)
				}
			}
			owner, id := task.Owner, task.ID
			if tt.owner != "" {
				owner = tt.owner
			}
			if tt.id != "" {
				id = tt.id
			}
			got, err := s.Cancel(ctx, task.Tenant, owner, id)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Cancel err = %v; want %v", err, tt.wantErr)
			}
			if tt.wantState == "" {
				return
			}
			if got.ID != task.ID || got.State != tt.wantState || state(t, s, task.ID) != tt.wantState {
				t.Fatalf("Cancel = %s %s (stored %s); want %s", got.ID, got.State, state(t, s, task.ID), tt.wantState)
			}
			if tt.wantState == StateCancelled {
				p := Project(got)
				if p.State != StateCancelled || p.PollAfter != 0 || p.Results != nil || p.Error == "" {
					t.Fatalf("a cancelled task projects as %+v; want final, no results, an error", p)
				}
			}
		})
	}
}

// TestCancelStopsTheRunningAttempt: the notification reaches the worker
// running the task, whose handler's context is cancelled; the
// heartbeat and polling are too slow to be the ones that noticed.
func TestCancelStopsTheRunningAttempt(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	cause := make(chan error, 1)
	entered := make(chan struct{})
	var got events
	w := newWorker(t, s, WorkerConfig{Lease: time.Hour, Heartbeat: 30 * time.Minute, PollInterval: time.Hour, OnEvent: got.add,
		Handler: func(ctx context.Context, t Task) Outcome {
			close(entered)
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return Succeeded(json.RawMessage(`"too late"`))
		}})
	runWorker(t, w)
	wait.For(t, patience, "the worker listens", func() bool { return countActivity(t, s.pool, listening) == 1 })
	task := mustSubmit(t, s, newTask("cancel-running"))
	waitEntered(t, s, entered)
	if _, err := s.Cancel(context.Background(), task.Tenant, task.Owner, task.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-cause:
		if !errors.Is(err, errCancelled) {
			t.Fatalf("handler's context ended by %v; want the cancellation", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the running attempt was not cancelled")
	}
	wait.For(t, patience, "the claim and the cancel reported", func() bool { return len(got.of(task.ID)) == 2 })
	if evs := got.of(task.ID); evs[1] != WorkerCancelled {
		t.Fatalf("events %v; want claimed, cancelled", evs)
	}
	if g := mustGet(t, s, task); g.State != StateCancelled || len(g.Results) != 0 {
		t.Fatalf("task %s with results %s; the late success must not apply", g.State, g.Results)
	}
}

// TestCancelWhileWorkersRun cancels tasks from many goroutines while
// several workers run them: every task ends succeeded or cancelled, a
// cancelled one has no results, and no task runs twice.
func TestCancelWhileWorkersRun(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	const total = 400
	var c calls
	handler := func(ctx context.Context, task Task) Outcome {
		c.add(task.ID)
		select {
		case <-ctx.Done():
			return Retry(0, ctx.Err())
		case <-time.After(time.Duration(rand.IntN(3)) * time.Millisecond):
		}
		return Succeeded(json.RawMessage(`1`))
	}
	for i := range 3 {
		runWorker(t, newWorker(t, newStore(db.pool(t)), WorkerConfig{Name: fmt.Sprint("w", i), Concurrency: 8, Handler: handler}))
	}
	tasks := make([]Task, total)
	for i := range tasks {
		tasks[i] = mustSubmit(t, s, newTask(fmt.Sprint("race-", i)))
	}
	var wg sync.WaitGroup
	var cancelled atomic.Int64
	for g := range 16 {
		wg.Go(func() {
			for i := g; i < total; i += 16 {
				if i%2 == 0 {
					continue
				}
				if _, err := s.Cancel(context.Background(), tasks[i].Tenant, tasks[i].Owner, tasks[i].ID); err == nil {
					cancelled.Add(1)
				} else if !errors.Is(err, ErrFinished) {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	wait.For(t, patience, "every task succeeded or cancelled", func() bool {
		return countRows(t, s.pool, "state IN ('succeeded', 'cancelled')") == total
	})
	if n := countRows(t, s.pool, "state = 'cancelled' AND results <> '[]'"); n != 0 {
		t.Fatalf("%d cancelled tasks have results", n)
	}
	if n := countRows(t, s.pool, "state = 'cancelled'"); n != int(cancelled.Load()) {
		t.Fatalf("%d tasks cancelled; Cancel succeeded %d times", n, cancelled.Load())
	}
	for _, task := range tasks {
		if n := c.get(task.ID); n > 1 {
			t.Fatalf("task %s ran %d times", task.ID, n)
		}
	}
}

// Cancel while the worker's LISTEN connection is gone: the notification
// is lost, and the heartbeat, which finds the task no longer running,
// still stops the attempt; the late success does not apply.
func TestCancelWhileListenIsDown(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	cause := make(chan error, 1)
	entered := make(chan struct{})
	var reconnects atomic.Int64
	// Only a heartbeat sees the cancel, and each waits at most Heartbeat
	// for the database: with 200 ms beats and a 3 s lease, beats timing
	// out one after another on a loaded machine (see beatUnderLoad) would
	// let the lease expire first, a cause this test refuses.
	w := newWorker(t, s, WorkerConfig{Lease: 10 * time.Second, Heartbeat: beatUnderLoad, PollInterval: 20 * time.Millisecond,
		Handler: func(ctx context.Context, t Task) Outcome {
			close(entered)
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return Succeeded(json.RawMessage(`"too late"`))
		}})
	runWorker(t, w)
	wait.For(t, patience, "the worker listens", func() bool { return countActivity(t, s.pool, listening) == 1 })
	task := mustSubmit(t, s, newTask("cancel-unheard"))
	waitEntered(t, s, entered)
	// Cut the listener off and cancel before it can listen again (it
	// waits at least 100ms before reconnecting).
	// This database's listener only: every test's database shares the
	// server, and another test's worker would lose its listener too.
	if _, err := s.pool.Exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND "+listening); err != nil {
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
	case <-time.After(patience):
		t.Fatal("the running attempt was not stopped")
	}
	wait.For(t, patience, "the listener reconnected", func() bool {
		reconnects.Store(int64(countActivity(t, s.pool, listening)))
		return reconnects.Load() == 1
	})
	if g := mustGet(t, s, task); g.State != StateCancelled || len(g.Results) != 0 {
		t.Fatalf("task %s with results %s; the late success must not apply", g.State, g.Results)
	}
}

// A cancel that races a claim: the worker emits its claimed events (here
// through a slow OnEvent, 1ms each) while Cancel commits and its
// notification arrives. A handler must never start for a task whose
// Cancel has returned, nor run on with a live context: the notification
// reaches the attempt even when it arrives between the claim and the
// attempt's start. Margins: notifications take well under slack to arrive
// on a loaded machine; without the fix the heartbeat (every 5s) is what
// ends such a handler's context.
func TestCancelRacingAClaimStopsTheAttempt(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	const total = 200
	const heartbeat = 5 * time.Second
	// A notification's delivery on a loaded machine (over 100ms seen with
	// two busy loops beside), well short of the heartbeat, which is what
	// ends such a handler's context without the fix.
	const slack = heartbeat / 10
	type run struct {
		started time.Time // the handler was called with a live context
		ended   time.Time // its context ended
	}
	var mu sync.Mutex
	runs := map[string][]run{}
	cancelledAt := map[string]time.Time{}
	w := newWorker(t, s, WorkerConfig{Concurrency: 32, Lease: 3 * heartbeat, Heartbeat: heartbeat,
		OnEvent: func(ev WorkerEvent) {
			if ev.Type == WorkerClaimed {
				time.Sleep(time.Millisecond)
			}
		},
		Handler: func(ctx context.Context, task Task) Outcome {
			if ctx.Err() != nil {
				return Outcome{}
			}
			r := run{started: time.Now()}
			select {
			case <-ctx.Done():
			case <-time.After(2 * heartbeat):
			}
			r.ended = time.Now()
			mu.Lock()
			runs[task.ID] = append(runs[task.ID], r)
			mu.Unlock()
			return Succeeded(json.RawMessage(`1`))
		}})
	tasks := make([]Task, total)
	for i := range tasks {
		tasks[i] = mustSubmit(t, s, newTask(fmt.Sprintf("race-%d", i)))
	}
	rand.Shuffle(len(tasks), func(i, j int) { tasks[i], tasks[j] = tasks[j], tasks[i] })
	runWorker(t, w)
	// Cancel once the worker listens: a cancellation sent before LISTEN
	// is never delivered (the heartbeat ends such an attempt, see
	// TestCancelWhileListenIsDown); this test is about the claim.
	wait.For(t, patience, "the worker listens", func() bool { return countActivity(t, s.pool, listening) == 1 })
	var wg sync.WaitGroup
	const cancellers = 4
	for c := range cancellers {
		wg.Go(func() {
			for i := c; i < total; i += cancellers {
				time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
				got, err := s.Cancel(ctx, tasks[i].Tenant, tasks[i].Owner, tasks[i].ID)
				if err != nil {
					t.Errorf("Cancel: %v", err)
					return
				}
				if got.State == StateCancelled {
					mu.Lock()
					cancelledAt[got.ID] = time.Now()
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	wait.For(t, patience, "every handler's context ended", func() bool { return w.count() == 0 })
	mu.Lock()
	defer mu.Unlock()
	if len(cancelledAt) != total {
		t.Fatalf("%d of %d Cancels returned cancelled", len(cancelledAt), total)
	}
	startedLate, liveLong := 0, 0
	for id, at := range cancelledAt {
		for _, r := range runs[id] {
			if r.started.Sub(at) > slack {
				startedLate++
				t.Logf("task %s: handler started %v after its Cancel returned", id, r.started.Sub(at))
			}
			if r.ended.Sub(at) > slack {
				liveLong++
				t.Logf("task %s: handler's context live %v after its Cancel returned", id, r.ended.Sub(at))
			}
		}
	}
	if startedLate > 0 || liveLong > 0 {
		t.Fatalf("of %d cancelled tasks: %d handlers started after their Cancel returned, %d ran on with a live context",
			total, startedLate, liveLong)
	}
}
