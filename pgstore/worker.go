package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Worker claims and runs tasks. Any number of workers, in any number of
// processes, may work on one database: a task is held by one attempt at a
// time, and a worker that lost its lease cannot change the task.
//
// A Worker is composed of small parts, each in its own file: the claim
// loop and attempts (here), the pure decision of what an ended attempt
// does to its task (decide), the completer that writes transitions, the
// heartbeat that keeps leases, the rescuer that takes back expired
// ones, and the listener for LISTEN/NOTIFY.
type Worker struct {
	store          *Store
	cfg            WorkerConfig
	uncertainKinds []string // kinds whose lost attempts become uncertain
	claimSQL       string   // the claim statement for cfg.Kinds

	running atomic.Bool
	wake    chan struct{} // a notification arrived or a slot freed

	attempts attempts
	tasks    sync.WaitGroup // attempt goroutines
	claims   atomic.Int64   // claim statements run

	completer *completer
	heartbeat *heartbeat
	rescuer   *rescuer
	listener  *listener

	test *workerTestHooks // nil except in this package's tests
}

// workerTestHooks are seams for this package's tests; production code
// never sets them.
type workerTestHooks struct {
	// crashOnStop makes Run stop without waiting or releasing, like a
	// killed process: its handlers run on and their late writes meet the
	// fence.
	crashOnStop bool
	// onFinish runs after each attempt's transition, with its result.
	onFinish func(t Task, o Outcome, applied bool, err error)
	// failWrite, when it returns an error, makes try number try of an
	// outcome's write fail with it instead of reaching the database.
	failWrite func(t Task, try int) error
}

// NewWorker returns a worker for s; start it with Run. It copies cfg's
// slices and maps, and returns an error for a configuration no worker
// can run (no Handler, a Heartbeat too long for the Lease, an unknown
// LostPolicy).
func NewWorker(s *Store, cfg WorkerConfig) (*Worker, error) {
	if s == nil {
		return nil, errors.New("pgstore: worker: nil store")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	w := &Worker{store: s, cfg: cfg, uncertainKinds: cfg.uncertainKinds(), wake: make(chan struct{}, 1)}
	switch {
	case len(cfg.Kinds) == 0:
		w.claimSQL = sqlClaim
	case !slices.ContainsFunc(cfg.Kinds, func(k string) bool { return !literalKind(k) }):
		w.claimSQL = claimKindsSQL(cfg.Kinds)
	default:
		w.claimSQL = sqlClaimAnyOf
	}
	if cfg.Reconcile == nil && len(w.uncertainKinds) > 0 {
		cfg.Logger.Warn("pgstore: worker: kinds whose lost attempts become uncertain, but no Reconcile: "+
			"such tasks wait for another worker's Reconcile (Store.Stats counts them)", "kinds", w.uncertainKinds)
	}
	w.completer = newCompleter(s.pool, &w.cfg, w.emit)
	w.heartbeat = &heartbeat{pool: s.pool, attempts: &w.attempts, lease: cfg.Lease, every: cfg.Heartbeat, logger: cfg.Logger}
	w.rescuer = &rescuer{pool: s.pool, cfg: &w.cfg, emit: w.emit}
	w.listener = &listener{pool: s.pool, kinds: cfg.Kinds, wake: w.signal, cancel: w.cancelTask,
		recheck: notifyRecheck, logger: cfg.Logger}
	return w, nil
}

// Run works until ctx ends, then shuts down gracefully: it stops claiming,
// lets running handlers finish for up to ShutdownTimeout, releases the
// tasks of the rest (by their kind's Lost policy) and cancels their
// handlers, waits up to ShutdownTimeout/2 for those to return, and
// returns nil. It returns an error only if called twice.
//
// When Run returns, the worker writes nothing more to the database: a
// handler that ignored its cancelled context past that grace runs on in
// its goroutine, but its outcome is discarded (its task was released).
// So a caller may close the pool as soon as Run returns.
//
// Run wakes on LISTEN/NOTIFY when a task is submitted or cancelled (on a
// connection of its own, taken from the pool) and polls every
// PollInterval regardless, so it works behind a transaction pooler too.
// It also extends the leases of its tasks, takes back tasks whose lease
// expired anywhere, and reconciles uncertain tasks when Reconcile is set.
func (w *Worker) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("pgstore: worker: Run called twice")
	}
	if w.test != nil {
		w.completer.failWrite = w.test.failWrite
	}
	// Attempts and their transitions outlive ctx until the shutdown deadline.
	base, cancelBase := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBase()
	var bg sync.WaitGroup
	bgCtx, stopBG := context.WithCancel(ctx)
	bg.Go(func() { w.listener.run(bgCtx) })
	bg.Go(func() { w.maintain(bgCtx, base) })
	hbCtx, stopHeartbeat := context.WithCancel(base)
	hbDone := make(chan struct{})
	go func() { defer close(hbDone); w.heartbeat.run(hbCtx) }()
	quit := make(chan struct{})
	go w.completer.run(w.completer.writes, quit)
	defer func() {
		close(quit)
		<-w.completer.stopped
	}()

	w.claimLoop(ctx, base)

	stopBG()
	bg.Wait()
	if w.test != nil && w.test.crashOnStop {
		// Writes stay open: a late write must meet the fence.
		stopHeartbeat()
		<-hbDone
		return nil
	}
	done := make(chan struct{})
	go func() { w.tasks.Wait(); close(done) }()
	if !waitClosed(done, w.cfg.ShutdownTimeout) {
		w.releaseAll(base)
		if !waitClosed(done, w.cfg.ShutdownTimeout/2) {
			w.cfg.Logger.Warn("pgstore: worker: handlers ignored cancellation; their outcomes will be discarded",
				"handlers", w.attempts.count())
		}
	}
	stopHeartbeat()
	<-hbDone
	w.completer.stop()
	return nil
}

// waitClosed waits up to d for done to close and reports whether it did.
func waitClosed(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// claimLoop claims tasks while there are free slots, until ctx ends.
func (w *Worker) claimLoop(ctx, base context.Context) {
	poll := time.NewTicker(w.cfg.PollInterval)
	defer poll.Stop()
	errWait := time.Duration(0)
	for ctx.Err() == nil { // a claim after cancellation would only be released again
		free := w.cfg.Concurrency - w.attempts.count()
		if free > 0 {
			claimed, sent, err := w.claim(base, free)
			for _, t := range claimed {
				w.start(base, t, StateRunning, sent) // even when stopping: shutdown finishes or releases them
			}
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				w.cfg.Logger.Error("pgstore: worker: claim", "err", err)
				errWait = min(max(2*errWait, 50*time.Millisecond), w.cfg.PollInterval)
				if !sleep(ctx, errWait) {
					return
				}
				continue
			}
			errWait = 0
			if len(claimed) == free {
				continue // there may be more
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		case <-poll.C:
		}
	}
}

// claim takes up to n runnable tasks, none that this worker still runs
// an attempt of, and returns when it sent the statement: the start of
// their leases by this process's clock. Its context is not the caller's:
// a claim cancelled after it committed would strand the claimed tasks
// until their lease ran out.
func (w *Worker) claim(base context.Context, n int) ([]Task, time.Time, error) {
	defer w.claims.Add(1)
	ctx, cancel := context.WithTimeout(base, w.cfg.Lease/2)
	defer cancel()
	sql, args := w.claimStatement(n)
	sent := time.Now()
	rows, _ := w.store.pool.Query(ctx, sql, args)
	claimed, err := pgx.CollectRows(rows, pgx.RowToStructByName[Task])
	took := time.Since(sent)
	for _, t := range claimed {
		w.emit(WorkerEvent{Type: WorkerClaimed, Kind: t.Kind, TaskID: t.ID, Attempt: t.Attempt, Latency: took})
	}
	if err != nil {
		return claimed, sent, interpretError("claim", err)
	}
	return claimed, sent, nil
}

// claimStatement is the claim of up to n tasks, for this worker's kinds.
func (w *Worker) claimStatement(n int) (string, pgx.NamedArgs) {
	args := pgx.NamedArgs{"limit": n, "lease_us": w.leaseUS(), "worker": w.cfg.Name,
		"held": w.attempts.ids(), "uncertain_kinds": w.uncertainKinds}
	if w.claimSQL == sqlClaimAnyOf {
		args["kinds"] = w.cfg.Kinds
	}
	return w.claimSQL, args
}

// leaseUS is the lease a claim or heartbeat writes into the row: the
// lease plus the rescuer's margin, in µs.
func (w *Worker) leaseUS() int64 {
	return (w.cfg.Lease + leaseMargin(w.cfg.Lease)).Microseconds()
}

// start runs one claimed attempt of t in its own goroutine.
func (w *Worker) start(base context.Context, t Task, from State, sent time.Time) {
	a := newAttempt(base, t, from, w.cfg.policy(t.Kind), sent, w.cfg.Lease)
	w.attempts.add(a)
	w.tasks.Go(func() { w.runAttempt(a) })
}

// result is what a handler call came to.
type result struct {
	outcome  Outcome
	panicked bool
	panic    any
	cause    error // context.Cause of the attempt when the handler returned
}

// runAttempt calls the handler (or Reconcile) on a's task, bounds it by
// the kind's Timeout, decides the transition and records it.
func (w *Worker) runAttempt(a *attempt) {
	h := w.cfg.Handler
	if a.from == StateUncertain {
		h = w.cfg.Reconcile
	}
	done := make(chan result, 1)
	go func() {
		// A handler that calls runtime.Goexit never returns: deferred,
		// the send still happens, as a panic would.
		res := result{panicked: true, panic: "the handler called runtime.Goexit"}
		defer func() { done <- res }()
		res = call(a.ctx, h, a.task)
		res.outcome.err = safeErr(res.outcome.err)
	}()

	var res result
	returned := true
	timeout := time.NewTimer(a.policy.Timeout)
	select {
	case res = <-done:
	case <-timeout.C:
		a.cancel(errTimedOut)
		// An outcome that comes within a heartbeat still counts; then the
		// attempt ends without the handler.
		grace := time.NewTimer(w.cfg.Heartbeat)
		select {
		case res = <-done:
		case <-grace.C:
			returned, res.cause = false, errTimedOut
		}
		grace.Stop()
	}
	timeout.Stop()

	v := verdict{from: a.from, returned: returned && !res.panicked, outcome: res.outcome, lost: a.policy.Lost}
	v.end, v.cause = endOf(res)
	tr := decide(v)
	st, applied, err := w.completer.record(a.ctx, a, tr)
	a.settled.Store(true)
	w.report(a, v, tr, st, applied, err)
	if !returned {
		<-done // the task and the slot stay taken until the handler lets go
	}
	a.stop()
	w.attempts.remove(a)
	w.signal() // a slot is free
	if w.test != nil && w.test.onFinish != nil {
		w.test.onFinish(a.task, res.outcome, applied, err)
	}
}

// call runs h, turning a panic into a result.
func call(ctx context.Context, h Handler, t Task) (r result) {
	defer func() {
		if p := recover(); p != nil {
			r = result{panicked: true, panic: p, cause: context.Cause(ctx)}
		}
	}()
	o := h(ctx, t)
	return result{outcome: o, cause: context.Cause(ctx)}
}

// endOf says how an attempt ended, from what its handler call came to.
func endOf(r result) (ending, error) {
	switch {
	case r.panicked:
		return endPanicked, fmt.Errorf("%v", r.panic)
	case r.cause == nil:
		return endReturned, nil
	case errors.Is(r.cause, errCancelled):
		return endCancelled, r.cause
	case errors.Is(r.cause, errShutdown):
		return endReleased, r.cause
	case errors.Is(r.cause, errTimedOut):
		return endTimedOut, r.cause
	}
	return endLeaseLost, r.cause
}

// report logs and emits what became of an attempt.
func (w *Worker) report(a *attempt, v verdict, tr transition, st State, applied bool, err error) {
	t := a.task
	ev := WorkerEvent{Type: tr.event, Kind: t.Kind, TaskID: t.ID, Attempt: t.Attempt, Latency: time.Since(a.began), Err: v.outcome.err}
	if ev.Err == nil && v.cause != nil {
		ev.Err = v.cause
	}
	switch {
	case err != nil:
		w.cfg.Logger.Error("pgstore: worker: recording an outcome failed", "task", t.ID, "attempt", t.Attempt, "err", err)
		return
	case tr.write == writeNone && tr.event == "":
		return
	case tr.write == writeNone:
	case !applied:
		w.cfg.Logger.Warn("pgstore: worker: the task moved on; outcome discarded", "task", t.ID, "attempt", t.Attempt)
		ev.Type = WorkerStale
	case tr.event == WorkerRetried && st == StateFailed:
		ev.Type = WorkerFailed // out of attempts
	}
	if tr.event == WorkerTimedOut {
		w.cfg.Logger.Warn("pgstore: worker: attempt timed out", "task", t.ID, "attempt", t.Attempt,
			"timeout", a.policy.Timeout, "now", st)
	}
	w.emit(ev)
}

// emit hands ev to OnEvent, if set.
func (w *Worker) emit(ev WorkerEvent) {
	if w.cfg.OnEvent != nil {
		w.cfg.OnEvent(ev)
	}
}

// cancelTask cancels this worker's attempt of a task that Store.Cancel
// ended.
func (w *Worker) cancelTask(id string) {
	if a := w.attempts.get(id); a != nil {
		a.cancel(errCancelled)
	}
}

// count is how many slots are taken.
func (w *Worker) count() int { return w.attempts.count() }

// maintain takes back expired leases and reconciles uncertain tasks.
func (w *Worker) maintain(ctx, base context.Context) {
	t := time.NewTicker(w.cfg.RescueInterval)
	defer t.Stop()
	for {
		if _, err := w.rescuer.rescue(ctx); err != nil && ctx.Err() == nil {
			w.cfg.Logger.Error("pgstore: worker: rescue", "err", err)
		}
		if w.cfg.Reconcile != nil {
			if err := w.reconcile(ctx, base); err != nil && ctx.Err() == nil {
				w.cfg.Logger.Error("pgstore: worker: reconcile", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reconcile claims due uncertain tasks into free slots and runs Reconcile
// on them. They are fenced like running tasks, on state uncertain; their
// claim holds them for a lease, without heartbeats.
func (w *Worker) reconcile(ctx, base context.Context) error {
	free := w.cfg.Concurrency - w.attempts.count()
	if free <= 0 {
		return nil
	}
	qctx, cancel := context.WithTimeout(ctx, w.cfg.Lease/2)
	defer cancel()
	sent := time.Now()
	rows, _ := w.store.pool.Query(qctx, sqlClaimUncertain, pgx.NamedArgs{"limit": free, "lease_us": w.leaseUS(),
		"kinds": w.cfg.Kinds, "worker": w.cfg.Name, "held": w.attempts.ids()})
	claimed, err := pgx.CollectRows(rows, pgx.RowToStructByName[Task])
	if err != nil {
		return interpretError("claim uncertain", err)
	}
	for _, t := range claimed {
		w.start(base, t, StateUncertain, sent)
	}
	return nil
}

// releaseAll hands the tasks of running handlers back, by their kind's
// Lost policy, and cancels the handlers; it cancels running Reconciles,
// whose tasks stay uncertain for another worker to reconcile once their
// claim has lapsed.
func (w *Worker) releaseAll(ctx context.Context) {
	for _, a := range w.attempts.reconciling() {
		a.cancel(errShutdown)
	}
	for _, a := range w.attempts.leased() {
		// Release before cancelling: a handler that returns the moment it
		// is cancelled must find its task gone, not overwrite the release.
		qctx, cancel := context.WithTimeout(ctx, w.cfg.Lease/2)
		rows, _ := w.store.pool.Query(qctx, sqlRelease, pgx.NamedArgs{"id": a.task.ID, "attempt": a.task.Attempt,
			"max_attempts": w.cfg.MaxAttempts, "reconcile_us": w.cfg.ReconcileInterval.Microseconds()})
		states, err := pgx.CollectRows(rows, pgx.RowTo[State])
		cancel()
		if err != nil {
			w.cfg.Logger.Error("pgstore: worker: release", "task", a.task.ID, "err", err)
		}
		if len(states) == 1 {
			ev := WorkerEvent{Type: WorkerRetried, Kind: a.task.Kind, TaskID: a.task.ID, Attempt: a.task.Attempt,
				Latency: time.Since(a.began), Err: errShutdown}
			switch states[0] {
			case StateUncertain:
				ev.Type = WorkerUncertain
			case StateFailed:
				ev.Type = WorkerFailed
			}
			w.emit(ev)
		}
		a.cancel(errShutdown)
	}
}

func (w *Worker) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}
