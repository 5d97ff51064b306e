package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Handler runs one attempt of a task and says how it ended. ctx is
// canceled when the worker loses the task's lease (another attempt may
// then run it) or when a shutdown's deadline passes; the handler should
// return promptly then. A panic counts as Retry(0, err).
type Handler func(ctx context.Context, t Task) Outcome

// Outcome is how a handler's attempt ended. Make one with Succeeded,
// Failed, Retry or Uncertain; the zero Outcome counts as a failure.
type Outcome struct {
	kind    outcomeKind
	results []json.RawMessage
	err     error
	after   time.Duration
}

type outcomeKind int

const (
	outcomeNone outcomeKind = iota
	outcomeSucceeded
	outcomeFailed
	outcomeRetry
	outcomeUncertain
)

// Succeeded ends the task with results. A success needs at least one
// result item that is not JSON null; without one the task fails with
// "no result items".
func Succeeded(results ...json.RawMessage) Outcome {
	return Outcome{kind: outcomeSucceeded, results: results}
}

// Failed ends the task with err. Partial results are kept, hidden from
// clients, and make the task eligible for Store.Recover.
func Failed(err error, partial ...json.RawMessage) Outcome {
	return Outcome{kind: outcomeFailed, err: err, results: partial}
}

// Retry ends this attempt with err and runs the task again after after,
// or after the worker's exponential backoff when after <= 0. Past
// WorkerConfig.MaxAttempts the task fails instead.
func Retry(after time.Duration, err error) Outcome {
	return Outcome{kind: outcomeRetry, err: err, after: after}
}

// Uncertain parks the task when the upstream outcome is unknown (a
// timeout after the request was sent): running it again could do the work
// twice. It is never run again by itself; WorkerConfig.Reconcile decides.
func Uncertain(err error) Outcome {
	return Outcome{kind: outcomeUncertain, err: err}
}

// WorkerConfig configures a Worker.
type WorkerConfig struct {
	// Handler runs the tasks. Required.
	Handler Handler
	// Reconcile resolves uncertain tasks: it is called with such a task
	// (same ID, Attempt increased) and returns what really happened:
	// Succeeded/Failed to finish it, Retry to run it again, Uncertain to
	// ask again after ReconcileInterval. Optional. Default nil: uncertain
	// tasks stay uncertain.
	Reconcile Handler
	// Kinds limits the worker to tasks of these kinds. Optional. Default:
	// every kind.
	Kinds []string
	// Name identifies the worker in the locked_by column. Optional.
	// Default: host name, process ID and a random suffix.
	Name string
	// Concurrency is how many tasks run at once. Optional. Default 16.
	Concurrency int
	// Lease is how long an attempt owns its task without a heartbeat.
	// Optional. Default 30s.
	Lease time.Duration
	// Heartbeat is how often leases are extended. Optional. Default Lease/3.
	Heartbeat time.Duration
	// PollInterval is how often the worker looks for work without a
	// notification (behind a transaction pooler, LISTEN never fires).
	// Optional. Default 1s.
	PollInterval time.Duration
	// RescueInterval is how often the worker requeues tasks whose lease
	// expired and looks for uncertain tasks to reconcile. Optional.
	// Default Lease/2.
	RescueInterval time.Duration
	// ReconcileInterval is how long an uncertain task waits between
	// reconcile checks. Optional. Default 30s.
	ReconcileInterval time.Duration
	// MaxAttempts bounds the attempts of a task (per recovery); after the
	// last, a retry, an expired lease or a release at shutdown fails it.
	// Every claim counts, released ones too: a handler that outlasts
	// ShutdownTimeout at every restart must still end. All workers of a
	// database should agree on it. Optional. Default 5.
	MaxAttempts int
	// BackoffBase and BackoffMax shape the delay before a retry:
	// min(BackoffMax, BackoffBase·2^(attempt−1)), less a random jitter of
	// up to half. Optional. Defaults 1s and 5m.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// ShutdownTimeout is how long Run waits, once its context ends, for
	// running handlers to finish; then it releases their tasks for another
	// worker, cancels the handlers' contexts and waits up to
	// ShutdownTimeout/2 more for them to return. Optional. Default 10s.
	ShutdownTimeout time.Duration
	// Logger receives errors and lost leases. Optional. Default: discard.
	Logger *slog.Logger
	// OnEvent receives what the worker does, for metrics and logs. It is
	// called synchronously and must not block. Optional.
	OnEvent func(WorkerEvent)
}

// jitter is the largest fraction of a backoff taken off at random.
const jitter = 0.5

// Worker claims and runs tasks. Any number of workers, in any number of
// processes, may work on one database: a task is held by one attempt at a
// time, and a worker that lost its lease cannot change the task.
type Worker struct {
	store *Store
	cfg   WorkerConfig

	running atomic.Bool
	wake    chan struct{} // a notification arrived or a slot freed

	mu       sync.Mutex
	inflight map[string]*inflight // running attempts by task ID
	tasks    sync.WaitGroup       // handler and reconcile goroutines

	reconciling atomic.Int64 // Reconcile calls in flight; they take slots too
	claims      atomic.Int64 // claim statements run

	completions   chan *completion // to the completer, unbuffered
	completerDone chan struct{}    // closed when the completer has stopped
	recheck       atomic.Bool      // a claim after a notification is scheduled

	// writes bounds every write on behalf of a handler. Run cancels it,
	// then sets stopped under writeMu's write lock: once Run has returned,
	// a handler that ignored its context writes nothing.
	writes     context.Context
	stopWrites context.CancelFunc
	writeMu    sync.RWMutex
	stopped    bool

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

type inflight struct {
	attempt int
	cancel  context.CancelCauseFunc
}

// errLeaseLost cancels a handler whose task was taken from it.
var errLeaseLost = errors.New("pgstore: lease lost")

// errWorkerStopped refuses the write of a handler that outlived Run.
var errWorkerStopped = errors.New("pgstore: worker stopped; outcome discarded")

// NewWorker returns a worker for s; start it with Run.
func NewWorker(s *Store, cfg WorkerConfig) (*Worker, error) {
	if s == nil {
		return nil, errors.New("pgstore: worker: nil store")
	}
	if cfg.Handler == nil {
		return nil, errors.New("pgstore: worker: Handler is required")
	}
	if cfg.Name == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		cfg.Name = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	setDefault(&cfg.Concurrency, 16)
	setDefault(&cfg.Lease, 30*time.Second)
	setDefault(&cfg.Heartbeat, cfg.Lease/3)
	setDefault(&cfg.PollInterval, time.Second)
	setDefault(&cfg.RescueInterval, cfg.Lease/2)
	setDefault(&cfg.ReconcileInterval, 30*time.Second)
	setDefault(&cfg.MaxAttempts, 5)
	setDefault(&cfg.BackoffBase, time.Second)
	setDefault(&cfg.BackoffMax, 5*time.Minute)
	setDefault(&cfg.ShutdownTimeout, 10*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Heartbeat >= cfg.Lease {
		return nil, fmt.Errorf("pgstore: worker: Heartbeat %v must be shorter than Lease %v", cfg.Heartbeat, cfg.Lease)
	}
	if cfg.Kinds == nil {
		cfg.Kinds = []string{}
	}
	return &Worker{store: s, cfg: cfg, wake: make(chan struct{}, 1), inflight: map[string]*inflight{},
		completions: make(chan *completion), completerDone: make(chan struct{})}, nil
}

func setDefault[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// Run works until ctx ends, then shuts down gracefully: it stops claiming,
// lets running handlers finish for up to ShutdownTimeout, releases the
// tasks of the rest and cancels their handlers, waits up to
// ShutdownTimeout/2 for those to return, and returns nil. It returns an
// error only if called twice.
//
// When Run returns, the worker writes nothing more to the database: a
// handler that ignored its canceled context past that grace runs on in
// its goroutine, but its outcome is discarded (its task was released).
// So a caller may close the pool as soon as Run returns.
//
// Run wakes on LISTEN/NOTIFY when a task is submitted (on a connection of
// its own, taken from the pool) and polls every PollInterval regardless,
// so it works behind a transaction pooler too. It also extends the
// leases of its tasks, requeues tasks whose lease expired anywhere, and
// reconciles uncertain tasks when Reconcile is set.
func (w *Worker) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("pgstore: worker: Run called twice")
	}
	// Handlers and their transitions outlive ctx until the shutdown deadline.
	base, cancelBase := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBase()
	w.writes, w.stopWrites = context.WithCancel(context.WithoutCancel(ctx))
	var bg sync.WaitGroup
	bgCtx, stopBG := context.WithCancel(ctx)
	hbCtx, stopHeartbeat := context.WithCancel(base)
	bg.Go(func() { w.listen(bgCtx) })
	bg.Go(func() { w.maintain(bgCtx, base) })
	hbDone := make(chan struct{})
	go func() { defer close(hbDone); w.heartbeat(hbCtx) }()
	stopCompleter := make(chan struct{})
	go w.completer(w.writes, stopCompleter)
	defer func() {
		close(stopCompleter)
		<-w.completerDone
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
	if !wait(done, w.cfg.ShutdownTimeout) {
		w.releaseAll(base)
		if !wait(done, w.cfg.ShutdownTimeout/2) {
			w.cfg.Logger.Warn("pgstore: worker: handlers ignored cancellation; their outcomes will be discarded",
				"handlers", w.count())
		}
	}
	stopHeartbeat()
	<-hbDone
	w.stopWrites() // cuts short the writes of handlers that ignored cancellation
	w.writeMu.Lock()
	w.stopped = true
	w.writeMu.Unlock()
	return nil
}

// wait waits up to d for done to close and reports whether it did.
func wait(done <-chan struct{}, d time.Duration) bool {
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
		free := w.cfg.Concurrency - w.count()
		if free > 0 {
			claimed, err := w.claim(base, free)
			for _, t := range claimed {
				w.start(base, t) // even when stopping: shutdown finishes or releases them
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

// claim takes up to n runnable tasks. Its context is not the caller's:
// a claim canceled after it committed would strand the claimed tasks
// until their lease ran out.
func (w *Worker) claim(base context.Context, n int) ([]Task, error) {
	defer w.claims.Add(1)
	ctx, cancel := context.WithTimeout(base, w.cfg.Lease/2)
	defer cancel()
	began := time.Now()
	rows, _ := w.store.pool.Query(ctx, sqlClaim, n, w.cfg.Lease.Microseconds(), w.cfg.Kinds, w.cfg.Name)
	claimed, err := pgx.CollectRows(rows, pgx.RowToStructByName[Task])
	took := time.Since(began)
	for _, t := range claimed {
		w.emit(WorkerEvent{Type: WorkerClaimed, Kind: t.Kind, TaskID: t.ID, Attempt: t.Attempt, Latency: took})
	}
	return claimed, err
}

// emit hands ev to OnEvent, if set.
func (w *Worker) emit(ev WorkerEvent) {
	if w.cfg.OnEvent != nil {
		w.cfg.OnEvent(ev)
	}
}

// emitOutcome reports how attempt t, begun at began, ended.
func (w *Worker) emitOutcome(t Task, from State, o Outcome, applied bool, err error, began time.Time) {
	ev := WorkerEvent{Kind: t.Kind, TaskID: t.ID, Attempt: t.Attempt, Latency: time.Since(began), Err: o.err}
	switch {
	case err != nil:
		return // logged; the attempt's lease decides what happens next
	case !applied:
		ev.Type = WorkerStale
	case from == StateUncertain && o.kind != outcomeUncertain:
		ev.Type = WorkerReconciled
	case o.kind == outcomeSucceeded && realItems(o.results) != nil:
		ev.Type = WorkerSucceeded
	case o.kind == outcomeRetry:
		ev.Type = WorkerRetried
	case o.kind == outcomeUncertain:
		ev.Type = WorkerUncertain
	default:
		ev.Type = WorkerFailed
	}
	w.emit(ev)
}

// count is how many slots are taken.
func (w *Worker) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.inflight) + int(w.reconciling.Load())
}

// start runs one claimed attempt of t in its own goroutine.
func (w *Worker) start(base context.Context, t Task) {
	ctx, cancel := context.WithCancelCause(base)
	w.mu.Lock()
	w.inflight[t.ID] = &inflight{attempt: t.Attempt, cancel: cancel}
	w.mu.Unlock()
	w.tasks.Go(func() {
		defer cancel(nil)
		began := time.Now()
		o := runHandler(ctx, w.cfg.Handler, t)
		// Until the outcome is written the attempt keeps its slot, so the
		// heartbeat keeps its lease.
		applied, err := w.record(ctx, t, StateRunning, o)
		w.emitOutcome(t, StateRunning, o, applied, err, began)
		switch {
		case err != nil:
			w.cfg.Logger.Error("pgstore: worker: finish task", "task", t.ID, "attempt", t.Attempt, "err", err)
		case !applied:
			w.cfg.Logger.Warn("pgstore: worker: lease lost; outcome discarded", "task", t.ID, "attempt", t.Attempt)
		}
		w.mu.Lock()
		if cur := w.inflight[t.ID]; cur != nil && cur.attempt == t.Attempt {
			delete(w.inflight, t.ID)
		}
		w.mu.Unlock()
		w.signal() // a slot is free
		if w.test != nil && w.test.onFinish != nil {
			w.test.onFinish(t, o, applied, err)
		}
	})
}

func runHandler(ctx context.Context, h Handler, t Task) (o Outcome) {
	defer func() {
		if r := recover(); r != nil {
			o = Retry(0, fmt.Errorf("handler panic: %v", r))
		}
	}()
	return h(ctx, t)
}

// record writes the outcome of attempt t.Attempt, claimed in state from.
// A write that fails for a transient reason (the database restarting, a
// broken connection) is retried with backoff: given up, the task would
// sit until its lease expired and then run a second time. It retries
// until the attempt's context ends: the heartbeat found the lease lost,
// Run released the task at shutdown, or Run returned. The first try
// happens even then; the fence decides whether it still counts.
func (w *Worker) record(attempt context.Context, t Task, from State, o Outcome) (bool, error) {
	backoff := 50 * time.Millisecond
	for try := 1; ; try++ {
		applied, err := w.recordOnce(t, from, o, try)
		if err == nil || !transient(err) {
			return applied, err
		}
		w.cfg.Logger.Warn("pgstore: worker: writing an outcome failed; retrying",
			"task", t.ID, "attempt", t.Attempt, "try", try, "err", err)
		w.emit(WorkerEvent{Type: WorkerOutcomeRetry, Kind: t.Kind, TaskID: t.ID, Attempt: t.Attempt, Err: err})
		if !sleep(attempt, backoff) {
			return false, err
		}
		backoff = min(2*backoff, w.cfg.Heartbeat)
	}
}

// recordOnce writes an outcome once, unless Run has returned.
func (w *Worker) recordOnce(t Task, from State, o Outcome, try int) (bool, error) {
	w.writeMu.RLock()
	defer w.writeMu.RUnlock()
	if w.stopped {
		return false, errWorkerStopped
	}
	if w.test != nil && w.test.failWrite != nil {
		if err := w.test.failWrite(t, try); err != nil {
			return false, err
		}
	}
	ctx, cancel := context.WithTimeout(w.writes, w.cfg.Lease/2)
	defer cancel()
	return w.finish(ctx, t, from, o)
}

// transient reports whether a failed write may succeed when tried again:
// the connection or the server failed, not the statement.
func transient(err error) bool {
	if errors.Is(err, errWorkerStopped) {
		return false
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return true // network, timeout, connection closed
	}
	switch pgErr.Code[:2] {
	case "08", // connection exception
		"40", // transaction rollback: serialization failure, deadlock
		"53", // insufficient resources: too many connections, out of memory
		"57", // operator intervention: shutdown, cannot connect now, canceled
		"58": // system error
		return true
	}
	return false
}

// finish records the outcome of attempt t.Attempt, claimed in state from.
// applied is false when the fence rejected it: the attempt lost its lease.
func (w *Worker) finish(ctx context.Context, t Task, from State, o Outcome) (bool, error) {
	errText := func(def string) string {
		if o.err != nil && o.err.Error() != "" {
			return o.err.Error()
		}
		return def
	}
	var sql string
	var args []any
	switch o.kind {
	case outcomeSucceeded, outcomeFailed, outcomeNone:
		c := &completion{id: t.ID, attempt: t.Attempt, state: StateSucceeded, results: jsonArray(o.results)}
		switch {
		case !json.Valid(c.results):
			c.state, c.err, c.results = StateFailed, "handler returned results that are not JSON", []byte("[]")
		case o.kind == outcomeNone:
			c.state, c.err = StateFailed, "handler returned no outcome"
		case o.kind == outcomeFailed:
			c.state, c.err = StateFailed, errText("task failed")
		case realItems(o.results) == nil:
			c.state, c.err = StateFailed, "no result items"
		}
		if from == StateRunning {
			return w.complete(ctx, c)
		}
		sql, args = sqlFinish, []any{c.state, c.results, c.err}
	case outcomeRetry:
		after := int64(-1)
		if o.after > 0 {
			after = o.after.Microseconds()
		}
		sql, args = sqlRetry, []any{after, w.cfg.MaxAttempts, errText("retry"),
			w.cfg.BackoffBase.Microseconds(), w.cfg.BackoffMax.Microseconds(), jitter}
	default: // outcomeUncertain
		sql, args = sqlUncertain, []any{w.cfg.ReconcileInterval.Microseconds(), errText("upstream outcome unknown")}
	}
	tag, err := w.store.pool.Exec(ctx, sql, append([]any{t.ID, t.Attempt, from}, args...)...)
	if err != nil {
		return false, interpretError("finish task", err)
	}
	return tag.RowsAffected() == 1, nil
}

// completion is a running task's final transition, for the completer.
type completion struct {
	id      string
	attempt int
	state   State // succeeded or failed
	results []byte
	err     string
	applied chan completed
}

type completed struct {
	applied bool
	err     error
}

// maxCompletionBatch bounds the rows of one batched transition.
const maxCompletionBatch = 500

// complete records c through the completer, which batches the final
// transitions of concurrently finishing tasks into one statement. When
// the completer has stopped (only a crashOnStop test lets a handler write
// after Run), it writes c alone.
func (w *Worker) complete(ctx context.Context, c *completion) (bool, error) {
	if w.running.Load() {
		c.applied = make(chan completed, 1)
		select {
		case w.completions <- c:
			r := <-c.applied
			return r.applied, r.err
		case <-w.completerDone:
		}
	}
	// No completer: not started (tests call finish directly), or stopped.
	tag, err := w.store.pool.Exec(ctx, sqlFinish, c.id, c.attempt, StateRunning, c.state, c.results, c.err)
	if err != nil {
		return false, interpretError("finish task", err)
	}
	return tag.RowsAffected() == 1, nil
}

// completer writes completions in batches until stop is closed: it takes
// what is waiting, writes it in one statement, and answers each sender.
func (w *Worker) completer(ctx context.Context, stop <-chan struct{}) {
	defer close(w.completerDone)
	for {
		var batch []*completion
		select {
		case c := <-w.completions:
			batch = append(batch, c)
		case <-stop:
			return
		}
	more:
		for len(batch) < maxCompletionBatch {
			select {
			case c := <-w.completions:
				batch = append(batch, c)
			default:
				break more
			}
		}
		w.flush(ctx, batch)
	}
}

func (w *Worker) flush(ctx context.Context, batch []*completion) {
	qctx, cancel := context.WithTimeout(ctx, w.cfg.Lease/2)
	defer cancel()
	ids := make([]string, len(batch))
	attempts := make([]int, len(batch))
	states := make([]string, len(batch))
	results := make([]string, len(batch))
	errs := make([]string, len(batch))
	for i, c := range batch {
		ids[i], attempts[i], states[i], results[i], errs[i] = c.id, c.attempt, string(c.state), string(c.results), c.err
	}
	rows, _ := w.store.pool.Query(qctx, sqlFinishBatch, ids, attempts, states, results, errs)
	done, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil && len(batch) > 1 {
		// Whatever broke the batch must not hold back the others.
		for _, c := range batch {
			w.flush(ctx, []*completion{c})
		}
		return
	}
	if err != nil {
		err = interpretError("finish task", err)
	}
	applied := make(map[string]bool, len(done))
	for _, id := range done {
		applied[id] = true
	}
	for _, c := range batch {
		c.applied <- completed{applied: applied[c.id], err: err}
	}
}

// jsonArray encodes items as a JSON array for a jsonb parameter.
func jsonArray(items []json.RawMessage) []byte {
	if len(items) == 0 {
		return []byte("[]")
	}
	b := []byte{'['}
	for i, it := range items {
		if i > 0 {
			b = append(b, ',')
		}
		if len(it) == 0 {
			it = json.RawMessage("null")
		}
		b = append(b, it...)
	}
	return append(b, ']')
}

// heartbeat extends the leases of running tasks and cancels the handlers
// of tasks this worker no longer holds.
func (w *Worker) heartbeat(ctx context.Context) {
	t := time.NewTicker(w.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := w.extend(ctx); err != nil && ctx.Err() == nil {
			w.cfg.Logger.Error("pgstore: worker: heartbeat", "err", err)
		}
	}
}

func (w *Worker) extend(ctx context.Context) error {
	w.mu.Lock()
	ids := make([]string, 0, len(w.inflight))
	attempts := make([]int, 0, len(w.inflight))
	for id, f := range w.inflight {
		ids, attempts = append(ids, id), append(attempts, f.attempt)
	}
	w.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	type held struct {
		ID      string `db:"id"`
		Attempt int    `db:"attempt"`
	}
	rows, _ := w.store.pool.Query(ctx, sqlHeartbeat, ids, attempts, w.cfg.Lease.Microseconds())
	kept, err := pgx.CollectRows(rows, pgx.RowToStructByName[held])
	if err != nil {
		return interpretError("heartbeat", err)
	}
	still := make(map[held]bool, len(kept))
	for _, k := range kept {
		still[k] = true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, id := range ids {
		if f := w.inflight[id]; f != nil && f.attempt == attempts[i] && !still[held{id, attempts[i]}] {
			f.cancel(errLeaseLost)
		}
	}
	return nil
}

// maintain requeues expired leases and reconciles uncertain tasks.
func (w *Worker) maintain(ctx, base context.Context) {
	t := time.NewTicker(w.cfg.RescueInterval)
	defer t.Stop()
	for {
		if _, err := w.rescue(ctx); err != nil && ctx.Err() == nil {
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

// rescueBatch bounds the rows one rescue statement touches.
const rescueBatch = 1000

// rescue requeues tasks whose lease expired, in batches, and returns how
// many it moved.
func (w *Worker) rescue(ctx context.Context) (int64, error) {
	var total int64
	type rescued struct {
		ID      string `db:"id"`
		Kind    string `db:"kind"`
		Attempt int    `db:"attempt"`
	}
	for {
		rows, _ := w.store.pool.Query(ctx, sqlRescue, rescueBatch, w.cfg.MaxAttempts,
			w.cfg.BackoffBase.Microseconds(), w.cfg.BackoffMax.Microseconds(), jitter)
		got, err := pgx.CollectRows(rows, pgx.RowToStructByName[rescued])
		if err != nil {
			return total, interpretError("rescue", err)
		}
		for _, r := range got {
			w.emit(WorkerEvent{Type: WorkerRescued, Kind: r.Kind, TaskID: r.ID, Attempt: r.Attempt})
		}
		total += int64(len(got))
		if len(got) < rescueBatch {
			return total, nil
		}
	}
}

// reconcile claims due uncertain tasks into free slots and runs Reconcile
// on them. They are fenced like running tasks, on state uncertain.
func (w *Worker) reconcile(ctx, base context.Context) error {
	free := w.cfg.Concurrency - w.count()
	if free <= 0 {
		return nil
	}
	rows, _ := w.store.pool.Query(ctx, sqlClaimUncertain, free, w.cfg.Lease.Microseconds(), w.cfg.Kinds, w.cfg.Name)
	claimed, err := pgx.CollectRows(rows, pgx.RowToStructByName[Task])
	if err != nil {
		return interpretError("claim uncertain", err)
	}
	for _, t := range claimed {
		w.startReconcile(base, t)
	}
	return nil
}

// startReconcile runs Reconcile on t. Its claim is not a lease row, so
// the heartbeat leaves it alone; it gets at most Lease to decide.
func (w *Worker) startReconcile(base context.Context, t Task) {
	ctx, cancel := context.WithTimeout(base, w.cfg.Lease)
	w.reconciling.Add(1)
	w.tasks.Go(func() {
		defer cancel()
		defer func() {
			w.reconciling.Add(-1)
			w.signal() // a slot is free
		}()
		began := time.Now()
		o := runHandler(ctx, w.cfg.Reconcile, t)
		applied, err := w.record(ctx, t, StateUncertain, o)
		w.emitOutcome(t, StateUncertain, o, applied, err, began)
		switch {
		case err != nil:
			w.cfg.Logger.Error("pgstore: worker: finish reconcile", "task", t.ID, "err", err)
		case !applied:
			w.cfg.Logger.Warn("pgstore: worker: reconcile outcome discarded (task moved on)", "task", t.ID)
		}
		if w.test != nil && w.test.onFinish != nil {
			w.test.onFinish(t, o, applied, err)
		}
	})
}

// releaseAll cancels every running handler and hands its task back.
func (w *Worker) releaseAll(ctx context.Context) {
	w.mu.Lock()
	held := make(map[string]*inflight, len(w.inflight))
	for id, f := range w.inflight {
		held[id] = f
	}
	w.mu.Unlock()
	// Release before canceling: a handler that returns the moment it is
	// canceled must find its task gone, not overwrite the release.
	for id, f := range held {
		if _, err := w.store.pool.Exec(ctx, sqlRelease, id, f.attempt, w.cfg.MaxAttempts); err != nil {
			w.cfg.Logger.Error("pgstore: worker: release", "task", id, "err", err)
		}
		f.cancel(context.Canceled)
	}
}

// listen turns notifications into wake-ups until ctx ends. On errors it
// reconnects with backoff; polling covers the gap.
func (w *Worker) listen(ctx context.Context) {
	wait := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := w.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		w.cfg.Logger.Warn("pgstore: worker: listen", "err", err)
		if !sleep(ctx, wait) {
			return
		}
		wait = min(2*wait, 10*time.Second)
	}
}

func (w *Worker) listenOnce(ctx context.Context) error {
	pc, err := w.store.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// A listening session never goes back to the pool.
	conn := pc.Hijack()
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		return err
	}
	w.signal() // catch up on anything submitted before LISTEN
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if len(w.cfg.Kinds) > 0 && !slices.Contains(w.cfg.Kinds, n.Payload) {
			continue
		}
		w.signal()
		// Submit announces a burst once: look again when it has landed.
		if w.recheck.CompareAndSwap(false, true) {
			time.AfterFunc(notifyRecheck, func() {
				w.recheck.Store(false)
				w.signal()
			})
		}
	}
}

func (w *Worker) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// sleep waits for d or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
