package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Worker claims and runs tasks. Any number of workers, in any number of
// processes, may work on one database: a task is held by one attempt at a
// time, and a worker that lost its lease cannot change the task.
type Worker struct {
	// A Worker is composed of small parts, each in its own file: the claim
	// loop and attempts (here), the pure decision of what an ended attempt
	// does to its task (decide), the completer that writes transitions, the
	// heartbeat that keeps leases, the rescuer that takes back expired
	// ones, and the listener for LISTEN/NOTIFY.

	store          *Store
	cfg            WorkerConfig
	uncertainKinds []string // kinds whose lost attempts become uncertain
	claimSQL       string   // the claim statement for cfg.Kinds, kind limits applied
	claimFreeSQL   string   // the claim for cfg.Kinds while none has limits
	// limited is set while some of cfg.Kinds have limits (or may have):
	// claims then use claimSQL. Each claim says whether it still holds.
	limited atomic.Bool

	running atomic.Bool
	wake    chan struct{} // a notification arrived or a slot freed
	// backlog is set while the last claim took all it asked for: more
	// tasks wait.
	backlog atomic.Bool
	// stopping is set once Run's context ended: the completer holds no
	// outcome from then on.
	stopping atomic.Bool

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
	// plainClaim, when set, is run instead of the claim statement, alone
	// (no transaction, no limits): an older claim, to measure against.
	plainClaim string
	// gathered runs in the claim loop when its wait for every slot ended
	// on the timer, before it reads the free slots again: a test claims
	// there to take them.
	gathered func()
	// claiming runs in the claim loop once it reserved the slots of a
	// claim, before the claim's statement.
	claiming func()
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
	w := &Worker{store: s, cfg: cfg, uncertainKinds: cfg.uncertainKinds(), wake: make(chan struct{}, 1),
		claimSQL: claimRunnableSQL(cfg.Kinds), claimFreeSQL: claimFreeSQL(cfg.Kinds)}
	w.limited.Store(true) // until a claim finds none
	if cfg.Reconcile == nil && len(w.uncertainKinds) > 0 {
		cfg.Logger.Warn("pgstore: worker: kinds whose lost attempts become uncertain, but no Reconcile: "+
			"such tasks wait for another worker's Reconcile (Store.Stats counts them)", "kinds", w.uncertainKinds)
	}
	w.completer = newCompleter(s.pool, &w.cfg, w.emit, w.busy)
	w.heartbeat = &heartbeat{pool: s.pool, attempts: &w.attempts, lease: cfg.Lease, every: cfg.Heartbeat, logger: cfg.Logger}
	w.rescuer = &rescuer{pool: s.pool, cfg: &w.cfg, emit: w.emit, minAge: sweepMinAge}
	w.listener = &listener{pool: s.pool, kinds: cfg.Kinds, wake: w.signal, cancel: w.cancelTask, limits: w.limitsSet,
		recheck: notifyRecheck, logger: cfg.Logger}
	return w, nil
}

// Run works until ctx ends, then shuts down gracefully: it stops claiming,
// lets running handlers finish for up to ShutdownTimeout, cancels the
// rest, waits up to ShutdownTimeout/2 for those to return, releasing the
// task of each as it returns (by its kind's Lost policy), and returns
// nil. Outcomes of handlers that returned are written at once (not held
// for a batch); a task whose outcome could not be written by then is
// released too. It returns an error only if called twice.
//
// When Run returns, the worker writes nothing more to the database: a
// handler that ignored its cancelled context past that grace runs on in
// its goroutine, but its outcome is discarded, and its task stays held
// until its lease ends (then any worker's rescue hands it back): it is
// never released while its handler may still run. So a caller may close
// the pool as soon as Run returns.
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
	// Outcomes are not held for batching any more: a handler that ignores
	// cancellation would keep them waiting past the release (which would
	// hand their tasks back) and keep Run from returning.
	w.stopping.Store(true)
	w.completer.nudge()

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
		w.releaseAll()
		if !waitClosed(done, w.cfg.ShutdownTimeout/2) {
			w.cfg.Logger.Warn("pgstore: worker: handlers ignored cancellation; their outcomes will be discarded",
				"handlers", w.attempts.count())
		}
	}
	stopHeartbeat()
	<-hbDone
	w.completer.stop()
	// Outcomes whose write did not land in time (none is in flight now):
	// their tasks go back like those of handlers that did not finish.
	w.releaseUnwritten(base)
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
	checked := time.Now() // when a poll last made the claim a limited one
	errWait := time.Duration(0)
	gather := time.NewTimer(time.Hour)
	gather.Stop()
	gathering := false     // the last claim was full: a backlog waits
	for ctx.Err() == nil { // a claim after cancellation would only be released again
		free := w.attempts.free(w.cfg.Concurrency)
		if gathering && free > 0 && free < w.cfg.Concurrency {
			// With a backlog, a claim for a few slots would soon be
			// followed by another for the few freed meanwhile: wait a
			// moment (claimGather at most) for every slot, and claim
			// them in one statement.
			select {
			case <-ctx.Done():
				return
			case <-w.wake:
				continue
			case <-gather.C:
				// The wait is over whatever comes next: should another
				// claim (a Reconcile's) take the free slots before they
				// are read, the timer is spent, and waiting on it again
				// would claim only once every slot is free.
				gathering = false
			}
			if w.test != nil && w.test.gathered != nil {
				w.test.gathered()
			}
			free = w.attempts.free(w.cfg.Concurrency)
		}
		if free > 0 {
			if gathering {
				gather.Stop()
				gathering = false
			}
			// The slots are reserved: a Reconcile's claim, running
			// meanwhile, cannot take them too.
			free = w.attempts.beginClaim(w.cfg.Concurrency)
			if w.test != nil && w.test.claiming != nil {
				w.test.claiming()
			}
			var claimed []Task
			var sent time.Time
			var took time.Duration
			var err error
			if free > 0 {
				claimed, sent, took, err = w.claim(base, free)
			}
			// Even when stopping: shutdown finishes or releases them.
			w.start(base, claimed, StateRunning, sent, took, free)
			w.completer.nudge() // the claim is over
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
			// No slot left (a Reconcile's claim took them): wait below.
			full := free > 0 && len(claimed) == free
			w.backlog.Store(full)
			if full {
				gathering = true // there may be more
				gather.Reset(claimGather)
				continue
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		case <-poll.C:
			// A poll also finds limits whose notification was missed: its
			// claim is a limited one, which says whether limits remain.
			if time.Since(checked) >= limitsRecheck {
				w.limited.Store(true)
				checked = time.Now()
			}
		}
	}
}

// claim takes up to n runnable tasks, none that this worker still runs
// an attempt of, and returns when it sent the statement: the start of
// their leases by this process's clock. Its context is not the caller's:
// a claim cancelled after it committed would strand the claimed tasks
// until their lease ran out.
func (w *Worker) claim(base context.Context, n int) ([]Task, time.Time, time.Duration, error) {
	defer w.claims.Add(1)
	ctx, cancel := context.WithTimeout(base, w.claimTimeout())
	defer cancel()
	sql, args := w.claimStatement(n)
	sent := time.Now()
	claimed, err := w.runClaim(ctx, sql, args)
	took := time.Since(sent)
	if err != nil {
		return nil, sent, took, interpretError("claim", err)
	}
	return claimed, sent, took, nil
}

// claimTimeout bounds a claim: half a lease, but never less than
// minClaimTimeout. A claim cancelled midway costs its connection, and the
// next claim prepares its statements again on a new one: with a short
// lease on a loaded machine, a bound that tight would cancel every claim.
// A claim that outlasts the lease is safe: its attempts' local deadlines
// count from when it was sent, so they end before they start and their
// tasks are rescued.
func (w *Worker) claimTimeout() time.Duration { return max(w.cfg.Lease/2, minClaimTimeout) }

// minClaimTimeout is the least time a claim may take.
const minClaimTimeout = 5 * time.Second

// claimGather is how long, at most, a worker facing a backlog waits for
// all its slots to be free before it claims.
const claimGather = time.Millisecond

// limitsRecheck is how often, at most, a poll's claim is a limited one
// to find limits whose notification the worker missed.
const limitsRecheck = time.Second

// claimStatement is the claim of up to n tasks, for this worker's kinds.
func (w *Worker) claimStatement(n int) (string, pgx.NamedArgs) {
	sql := w.claimFreeSQL
	if w.limited.Load() {
		sql = w.claimSQL
	}
	return sql, pgx.NamedArgs{"limit": n, "lease_us": w.leaseUS(), "worker": w.cfg.Name,
		"held": w.attempts.ids(), "uncertain_kinds": w.uncertainKinds, "kinds": w.cfg.Kinds}
}

// runClaim runs a claim statement and returns the claimed tasks, in a
// transaction of its own, in one round trip. The claim of kinds without
// limits (claimFreeSQL) runs after sqlClaimSettings; a claim with limits
// after sqlLockLimitedKinds, which sets them too: its snapshot is taken
// after the locks are granted, so it sees every claim of a limited kind
// committed before. That needs READ COMMITTED, whatever the database's
// default_transaction_isolation: under REPEATABLE READ or SERIALIZABLE
// the transaction's one snapshot is taken at the lock statement, before
// the locks are granted, and the claim would count the kind's attempts
// as they were before it waited. A kind it reports held back by its
// limits is emitted as WorkerHeldBack.
func (w *Worker) runClaim(ctx context.Context, sql string, args pgx.NamedArgs) ([]Task, error) {
	if w.test != nil && w.test.plainClaim != "" && (sql == w.claimSQL || sql == w.claimFreeSQL) {
		rows, _ := w.store.pool.Query(ctx, w.test.plainClaim, args)
		return pgx.CollectRows(rows, pgx.RowToStructByName[Task])
	}
	free := sql == w.claimFreeSQL
	var b pgx.Batch
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	if free {
		b.Queue(sqlClaimSettings)
	} else {
		b.Queue(sqlLockLimitedKinds, pgx.NamedArgs{"kinds": w.cfg.Kinds})
	}
	b.Queue(sql, args)
	b.Queue("COMMIT")
	br := w.store.pool.SendBatch(ctx, &b)
	_, err := br.Exec()
	if err == nil && free {
		_, err = br.Exec()
	} else if err == nil {
		var settings string
		var locked int
		var limited bool
		if err = br.QueryRow().Scan(&settings, &locked, &limited); err == nil {
			w.limited.Store(limited)
		}
	}
	var got []Task
	if err == nil {
		rows, qerr := br.Query()
		if qerr == nil {
			got, qerr = pgx.CollectRows(rows, pgx.RowToStructByName[Task])
		}
		err = qerr
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	return w.sortClaimed(got), nil
}

// sortClaimed returns the tasks a claim returned without its marks: a
// kind held back is emitted as WorkerHeldBack.
func (w *Worker) sortClaimed(got []Task) []Task {
	claimed := got[:0]
	for _, t := range got {
		if t.State == stateHeld {
			w.emit(WorkerEvent{Type: WorkerHeldBack, Kind: t.Kind})
			continue
		}
		claimed = append(claimed, t)
	}
	return claimed
}

// limitsSet learns that the limits of kind were set: the worker claims
// with limits (the next claim finds out whether any remain) at once.
func (w *Worker) limitsSet(string) {
	w.limited.Store(true)
	w.signal()
}

// leaseUS is the lease a claim or heartbeat writes into the row: the
// lease plus the rescuer's margin, in µs.
func (w *Worker) leaseUS() int64 {
	return (w.cfg.Lease + leaseMargin(w.cfg.Lease)).Microseconds()
}

// start runs the attempts of a claim (announced by beginClaim), each in
// its own goroutine. The attempts are registered first, so that a
// cancellation arriving from then on finds them; a WorkerClaimed event
// (for a claim of running tasks, which took took) follows; and only then
// do the handlers start, each unless its attempt was cancelled meanwhile.
func (w *Worker) start(base context.Context, claimed []Task, from State, sent time.Time, took time.Duration, reserved int) {
	as := make([]*attempt, len(claimed))
	for i, t := range claimed {
		as[i] = newAttempt(base, t, from, w.cfg.policy(t.Kind), sent, w.cfg.Lease)
		if t.State == StateCancelled {
			// A task cancelled while an earlier Reconcile held it, whose
			// claim lapsed: it ends without a call.
			as[i].cancel(errCancelled)
		}
	}
	if w.attempts.register(as, reserved) {
		w.signal()
	}
	if from == StateRunning {
		for _, t := range claimed {
			w.emit(WorkerEvent{Type: WorkerClaimed, Kind: t.Kind, TaskID: t.ID, Attempt: t.Attempt, Latency: took})
		}
	}
	for _, a := range as {
		w.tasks.Go(func() { w.runAttempt(a) })
	}
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
	if a.ctx.Err() != nil {
		// Cancelled (or its lease lost) before it started: the handler
		// is not called at all.
		done <- result{cause: context.Cause(a.ctx)}
	} else {
		go w.callHandler(a, h, done)
	}

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
	if returned {
		// The handler let go: its slot may take the next task while the
		// transition is written (batched with others by the completer).
		// Without a backlog, the claim loop hears of it after the write,
		// as before: an idle worker's claim, racing the write for the
		// database, would only delay it.
		w.attempts.handOff(a)
		if w.backlog.Load() {
			w.signal()
		}
		w.completer.nudge()
	}
	st, applied, err := w.completer.record(a.ctx, a, tr)
	a.settled.Store(true)
	w.report(a, v, tr, st, applied, err)
	if !returned {
		<-done // the task and the slot stay taken until the handler lets go
	}
	a.stop()
	w.attempts.remove(a)
	w.signal() // a slot is free, or the bound on held attempts has room
	if w.test != nil && w.test.onFinish != nil {
		w.test.onFinish(a.task, res.outcome, applied, err)
	}
}

// callHandler runs h on a's task and sends what it came to on done.
func (w *Worker) callHandler(a *attempt, h Handler, done chan<- result) {
	// A handler that calls runtime.Goexit never returns: deferred,
	// the send still happens, as a panic would.
	res := result{panicked: true, panic: "the handler called runtime.Goexit"}
	defer func() { done <- res }()
	res = call(a.ctx, h, a.task)
	res.outcome.err = safeErr(res.outcome.err)
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
	case !applied && tr.write == writeCancelled:
		// Cancel ended the task at once (no attempt held it by then).
	case !applied:
		w.cfg.Logger.Warn("pgstore: worker: the task moved on; outcome discarded", "task", t.ID, "attempt", t.Attempt)
		ev.Type = WorkerStale
	case st == StateCancelled:
		ev.Type = WorkerCancelled // cancelled while the attempt ran: what it returned is discarded
	case tr.event == WorkerRetried && st == StateFailed:
		ev.Type = WorkerFailed // out of attempts
	case tr.write == writeRelease && st == StateUncertain:
		ev.Type = WorkerUncertain
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
func (w *Worker) cancelTask(id string) { w.attempts.cancel(id) }

// busy is how many outcomes may come soon, for the completer's wait:
// handlers running, and while a backlog waits, claims in flight (an
// idle worker's claim, which a freed slot starts, rarely brings any).
// While some of the worker's kinds have limits it is 0: a held outcome
// would keep its attempt counted against MaxRunning, so outcomes are
// written at once, as before CompletionWait. So it is once Run's context
// ended.
func (w *Worker) busy() int {
	if w.limited.Load() || w.stopping.Load() {
		return 0
	}
	return w.attempts.busy(w.backlog.Load())
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
		if err := w.rescuer.maybeSweepWaiting(ctx); err != nil && ctx.Err() == nil {
			w.cfg.Logger.Error("pgstore: worker: sweep waiting tenants", "err", err)
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
	free := w.attempts.beginClaim(w.cfg.Concurrency) // reserved, as the claim loop's are
	if free <= 0 {
		if w.attempts.register(nil, 0) {
			w.signal()
		}
		return nil
	}
	qctx, cancel := context.WithTimeout(ctx, w.claimTimeout())
	defer cancel()
	sent := time.Now()
	claimed, err := w.runClaim(qctx, sqlClaimUncertain, pgx.NamedArgs{"limit": free, "lease_us": w.leaseUS(),
		"kinds": w.cfg.Kinds, "worker": w.cfg.Name, "held": w.attempts.ids()})
	w.start(base, claimed, StateUncertain, sent, time.Since(sent), free)
	w.completer.nudge()
	if err != nil {
		return interpretError("claim uncertain", err)
	}
	return nil
}

// releaseAll cancels the running handlers and Reconciles at shutdown.
// Each task is handed back (by its kind's Lost policy) by its own
// attempt once the handler has returned, never before: released while
// the handler still ran, the task could start again elsewhere beside it,
// and its kind's limits would not count the handler. A Reconcile's task
// stays uncertain for another worker once its claim has lapsed. A
// handler that does not return within Run's last wait keeps its task
// until its lease ends (the heartbeat stops with Run), when a rescue
// hands it back.
func (w *Worker) releaseAll() {
	for _, a := range w.attempts.reconciling() {
		a.cancel(errShutdown)
	}
	for _, a := range w.attempts.leased() {
		// An attempt whose handler returned is left to the write of its
		// outcome (releaseUnwritten takes its task back if that write
		// does not land); cancelling it would end its write's retries.
		if !w.attempts.handedOffNow(a) {
			a.cancel(errShutdown)
		}
	}
}

// releaseUnwritten hands back, once the completer has stopped, the tasks
// of attempts whose handler returned but whose outcome was not written.
func (w *Worker) releaseUnwritten(ctx context.Context) {
	for _, a := range w.attempts.unwritten() {
		w.release(ctx, a)
	}
}

// release hands a's task back by its kind's Lost policy, fenced by its
// attempt, and reports it.
func (w *Worker) release(ctx context.Context, a *attempt) {
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
}

func (w *Worker) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}
