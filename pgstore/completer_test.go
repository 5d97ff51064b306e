package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/wait"
)

// Results Postgres cannot hold however they are escaped (nested deeper
// than its parser goes) are recorded as a failure, once.
func TestResultsTooDeepAreRecordedAsAFailure(t *testing.T) {
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
	if !wait.Until(patience, func() bool { st := state(t, s, task.ID); return st == StateSucceeded || st == StateFailed }) {
		t.Fatalf("task is %s; want it finished", state(t, s, task.ID))
	}
	if n := c.get(task.ID); n != 1 {
		t.Fatalf("handler ran %d times; want once", n)
	}
	t.Logf("deep results ended %s: %q", state(t, s, task.ID), mustGet(t, s, task).Error)
}

// outcomes Postgres refuses as such (NUL in text, \u0000 in
// jsonb) are stored sanitized, once; the task does not run again.
func TestOutcomesPostgresRefusesAreRecorded(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	var c calls
	// A lease long enough that no attempt is lost on a loaded machine:
	// each task must run exactly once.
	w := newWorker(t, s, WorkerConfig{Lease: 10 * time.Second, Heartbeat: 2 * time.Second,
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

// heldWorker is a worker whose completer holds outcomes for an hour
// while the handler of key "blocker" runs, until unblock is closed; every
// other handler returns at once and reports on returned.
func heldWorker(t *testing.T, s *Store, ev *events) (w *Worker, unblock chan struct{}, returned chan string) {
	t.Helper()
	unblock, returned = make(chan struct{}), make(chan string, 16)
	w = newWorker(t, s, WorkerConfig{CompletionWait: time.Hour, OnEvent: ev.add,
		Handler: func(ctx context.Context, task Task) Outcome {
			if task.IdempotencyKey == "blocker" {
				<-unblock
			} else {
				defer func() { returned <- task.ID }()
			}
			return Succeeded(json.RawMessage(`1`))
		}})
	return w, unblock, returned
}

// An outcome waits in the completer's batch while another handler runs,
// and its slot is free meanwhile; the wait ends when no handler runs.
func TestCompletionWaitsWhileAHandlerRuns(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	var ev events
	w, unblock, returned := heldWorker(t, s, &ev)
	runWorker(t, w)
	blocker := mustSubmit(t, s, newTask("blocker"))
	waitState(t, s, blocker.ID, StateRunning)
	quick := mustSubmit(t, s, newTask("quick"))
	<-returned
	wait.For(t, patience, "the quick task's slot freed", func() bool { return w.count() == 1 })
	time.Sleep(100 * time.Millisecond)
	if st := state(t, s, quick.ID); st != StateRunning {
		t.Fatalf("quick task is %s while the blocker runs; want its outcome held (running)", st)
	}
	close(unblock)
	waitState(t, s, quick.ID, StateSucceeded)
	waitState(t, s, blocker.ID, StateSucceeded)
}

// An outcome held in the batch is still fenced by its attempt: when the
// task moved on meanwhile (its lease lost, another worker's attempt), the
// held write does not apply and the attempt ends stale.
func TestHeldCompletionIsFenced(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	var ev events
	w, unblock, returned := heldWorker(t, s, &ev)
	runWorker(t, w)
	blocker := mustSubmit(t, s, newTask("blocker"))
	waitState(t, s, blocker.ID, StateRunning)
	quick := mustSubmit(t, s, newTask("quick"))
	<-returned
	// Another attempt takes the task over while the outcome is held.
	if _, err := s.pool.Exec(context.Background(), "UPDATE idemgate_tasks SET attempt = attempt + 1 WHERE id = $1::uuid", quick.ID); err != nil {
		t.Fatal(err)
	}
	close(unblock)
	waitState(t, s, blocker.ID, StateSucceeded)
	wait.For(t, patience, "the quick attempt ended", func() bool { return len(ev.of(quick.ID)) == 2 })
	if got := ev.of(quick.ID); got[1] != WorkerStale {
		t.Fatalf("quick task's events %v; want claimed then stale", got)
	}
	if st := state(t, s, quick.ID); st != StateRunning {
		t.Fatalf("quick task is %s; want running (the newer attempt's), untouched by the held outcome", st)
	}
}

// Stopping the worker flushes held outcomes: once the running handlers
// have returned, Run writes what it holds and returns, without waiting
// out CompletionWait.
func TestStopFlushesHeldCompletions(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	var ev events
	w, unblock, returned := heldWorker(t, s, &ev)
	stop := runWorker(t, w)
	blocker := mustSubmit(t, s, newTask("blocker"))
	waitState(t, s, blocker.ID, StateRunning)
	quick := mustSubmit(t, s, newTask("quick"))
	<-returned
	go func() { time.Sleep(50 * time.Millisecond); close(unblock) }()
	// CompletionWait is an hour: a Run that did not flush once no handler
	// runs would outlast patience, whatever the machine's speed.
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(patience):
		t.Fatalf("Run still running %v after stop; want it to flush at once once no handler runs (CompletionWait is an hour)", patience)
	}
	for _, task := range []Task{quick, blocker} {
		if st := state(t, s, task.ID); st != StateSucceeded {
			t.Errorf("task %s is %s after Run returned; want succeeded", task.IdempotencyKey, st)
		}
	}
}

// Shutting down while a handler ignores cancellation: an outcome held
// for it (its handler returned before the shutdown deadline) is written
// as soon as Run's context ends, the stuck handler's task stays held (it
// is not handed back while its handler may run; its lease ends later),
// and Run returns within its shutdown bounds, not after CompletionWait.
func TestShutdownWritesHeldOutcomesPastAStuckHandler(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	var ev events
	unblock, returned := make(chan struct{}), make(chan string, 16)
	defer close(unblock)
	const shutdown = 300 * time.Millisecond
	w := newWorker(t, s, WorkerConfig{CompletionWait: time.Hour, ShutdownTimeout: shutdown, OnEvent: ev.add,
		Handler: func(ctx context.Context, task Task) Outcome {
			if task.IdempotencyKey == "blocker" {
				<-unblock // ignores cancellation
			} else {
				defer func() { returned <- task.ID }()
			}
			return Succeeded(json.RawMessage(`1`))
		}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	blocker := mustSubmit(t, s, newTask("blocker"))
	waitState(t, s, blocker.ID, StateRunning)
	quick := mustSubmit(t, s, newTask("quick"))
	<-returned
	wait.For(t, patience, "the quick task's slot freed", func() bool { return w.count() == 1 })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(patience):
		t.Fatalf("Run has not returned %v after its context ended (ShutdownTimeout %v); want it bounded by the shutdown, not CompletionWait", patience, shutdown)
	}
	if st := state(t, s, quick.ID); st != StateSucceeded {
		t.Errorf("quick task is %s (events %v); want succeeded: its handler returned before the shutdown deadline", st, ev.of(quick.ID))
	}
	if st := state(t, s, blocker.ID); st != StateRunning {
		t.Errorf("blocker task is %s; want running: its handler still runs, so its lease must run out first", st)
	}
}

// The shutdown's release cancels the handlers still running, and hands
// their tasks back only as each returns; it leaves alone those whose
// handler returned and whose outcome waits for its write: that outcome
// is the task's, and the task does not run again.
func TestReleaseSkipsAttemptsWhoseHandlerReturned(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	var ev events
	var c calls
	unblock, returned := make(chan struct{}), make(chan string, 16)
	w := newWorker(t, s, WorkerConfig{CompletionWait: time.Hour, OnEvent: ev.add,
		Handler: func(ctx context.Context, task Task) Outcome {
			c.add(task.ID)
			if task.IdempotencyKey == "blocker" {
				<-unblock // ignores cancellation
			} else {
				defer func() { returned <- task.ID }()
			}
			return Succeeded(json.RawMessage(`1`))
		}})
	runWorker(t, w)
	blocker := mustSubmit(t, s, newTask("blocker"))
	waitState(t, s, blocker.ID, StateRunning)
	quick := mustSubmit(t, s, newTask("quick"))
	<-returned
	wait.For(t, patience, "the quick task's slot freed", func() bool { return w.count() == 1 })
	w.releaseAll()
	if st := state(t, s, quick.ID); st != StateRunning {
		t.Errorf("quick task is %s after the release; want running, its held outcome still to be written", st)
	}
	if st := state(t, s, blocker.ID); st != StateRunning {
		t.Errorf("blocker task is %s after the release; want running while its handler runs", st)
	}
	close(unblock)
	waitState(t, s, quick.ID, StateSucceeded)
	// The blocker returned a success once cancelled: it counts.
	waitState(t, s, blocker.ID, StateSucceeded)
	if got := mustGet(t, s, quick); got.Attempt != 1 || c.get(quick.ID) != 1 {
		t.Errorf("quick task succeeded at attempt %d after %d runs (events %v); want its first run's outcome", got.Attempt, c.get(quick.ID), ev.of(quick.ID))
	}
}

// Many workers with many slots, handlers ending at random moments, and
// outcomes batched across attempts: every task runs once and succeeds,
// and no slot or held outcome is left behind. Run it with -race.
func TestBatchedCompletionsRace(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	var c calls
	handler := func(_ context.Context, task Task) Outcome {
		c.add(task.ID)
		if n := rand.IntN(4); n > 0 {
			time.Sleep(time.Duration(n) * 300 * time.Microsecond)
		}
		return Succeeded(json.RawMessage(`1`))
	}
	const tasks = 1500
	var workers []*Worker
	for i := range 3 {
		w := newWorker(t, newStore(db.pool(t)), WorkerConfig{Name: fmt.Sprint("w", i), Concurrency: 24,
			CompletionWait: time.Duration(i) * time.Millisecond, Handler: handler})
		workers = append(workers, w)
		runWorker(t, w)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			batch := make([]NewTask, 0, tasks/8)
			for i := g; i < tasks; i += 8 {
				batch = append(batch, newTask(fmt.Sprint("race-", i)))
			}
			if _, err := s.SubmitMany(context.Background(), batch); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	wait.For(t, 2*patience, "every task succeeded", func() bool { return countRows(t, s.pool, "state = 'succeeded'") == tasks })
	c.mu.Lock()
	for id, n := range c.n {
		if n != 1 {
			t.Errorf("task %s ran %d times", id, n)
		}
	}
	c.mu.Unlock()
	for _, w := range workers {
		wait.For(t, patience, "every attempt removed", func() bool {
			w.attempts.mu.Lock()
			defer w.attempts.mu.Unlock()
			return len(w.attempts.m) == 0 && w.attempts.writing == 0
		})
	}
}
