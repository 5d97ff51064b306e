package pgstore

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// maxCompletionBatch bounds the rows of one batched transition.
const maxCompletionBatch = 500

// completer writes the transitions of ended attempts. The final
// transitions of running tasks, the hot path, go through one goroutine
// that batches them into one statement: whatever is waiting, plus what
// arrives within WorkerConfig.CompletionWait while the worker is busy
// (on an idle worker, nothing is waited for); the
// others are written alone. A write that fails for a transient reason is tried again
// while the attempt stands. Once stopped, it writes nothing: a handler
// that outlives its worker cannot touch the database.
type completer struct {
	pool   *pgxpool.Pool
	cfg    *WorkerConfig
	emit   func(WorkerEvent)
	logger *slog.Logger
	// busy is how many outcomes of the worker may come soon, worth
	// waiting for: handlers running and claims in flight.
	busy func() int
	// nudged wakes a batch's wait to look at busy again.
	nudged chan struct{}

	in      chan *completion // to the batching goroutine, unbuffered
	started atomic.Bool      // the batching goroutine runs (or ran)
	stopped chan struct{}    // closed when the batching goroutine has returned

	mu     sync.RWMutex // writes hold it shared; stop takes it
	closed bool
	// writes bounds every write; stop cancels it first, so that stop
	// does not wait for a write stuck on a dead connection.
	writes       context.Context
	cancelWrites context.CancelFunc

	// failWrite, in tests, makes a write's try fail before it reaches the
	// database.
	failWrite func(t Task, try int) error
}

// completion is a running task's final transition, for the batch.
type completion struct {
	id      string
	attempt int
	state   State // succeeded or failed
	results []byte
	err     string
	done    chan completed
}

type completed struct {
	state   State // the task's state after the write: the completion's, or cancelled
	applied bool
	err     error
}

func newCompleter(pool *pgxpool.Pool, cfg *WorkerConfig, emit func(WorkerEvent), busy func() int) *completer {
	c := &completer{pool: pool, cfg: cfg, emit: emit, logger: cfg.Logger, busy: busy, nudged: make(chan struct{}, 1),
		in: make(chan *completion), stopped: make(chan struct{})}
	c.writes, c.cancelWrites = context.WithCancel(context.Background())
	return c
}

// run batches completions until quit is closed; writes run under ctx.
func (c *completer) run(ctx context.Context, quit <-chan struct{}) {
	c.started.Store(true)
	defer close(c.stopped)
	wait := time.NewTimer(time.Hour)
	wait.Stop()
	for {
		var batch []*completion
		select {
		case x := <-c.in:
			batch = append(batch, x)
		case <-quit:
			return
		}
		c.flush(ctx, c.gather(batch, wait))
	}
}

// gather adds to batch the completions waiting, then those that arrive
// within CompletionWait of the first, as long as the worker is busy (a
// handler runs or a claim is in flight: more outcomes may come within
// the wait) and the batch has room.
func (c *completer) gather(batch []*completion, wait *time.Timer) []*completion {
	for len(batch) < maxCompletionBatch {
		select {
		case x := <-c.in:
			batch = append(batch, x)
			continue
		default:
		}
		break
	}
	if c.cfg.CompletionWait <= 0 || len(batch) >= maxCompletionBatch || c.busy() == 0 {
		return batch
	}
	wait.Reset(c.cfg.CompletionWait)
	defer wait.Stop()
	for len(batch) < maxCompletionBatch && c.busy() > 0 {
		select {
		case x := <-c.in:
			batch = append(batch, x)
		case <-c.nudged:
		case <-wait.C:
			return batch
		}
	}
	return batch
}

// nudge tells a batch's wait that the worker may have become idle.
func (c *completer) nudge() {
	select {
	case c.nudged <- struct{}{}:
	default:
	}
}

// stop makes every later write fail with errWorkerStopped and waits for
// the writes in progress.
func (c *completer) stop() {
	c.cancelWrites()
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
}

// record writes tr for attempt a and reports whether the fence let it
// apply, and the task's state after it. It retries a transient failure
// with backoff until a's context ends (the lease was lost or could not
// be confirmed, the task was released or cancelled); the first try
// happens even then, and the fence decides whether it still counts. A
// final transition Postgres refuses for good is recorded as a failure
// saying why, so the task never runs again for a write that cannot land.
func (c *completer) record(ctx context.Context, a *attempt, tr transition) (State, bool, error) {
	backoff := 50 * time.Millisecond
	fellBack := false
	for try := 1; ; try++ {
		st, applied, err := c.recordOnce(a, tr, try)
		if err == nil {
			return st, applied, nil
		}
		if !transient(err) {
			if tr.write != writeFinish || fellBack {
				return "", false, err
			}
			c.logger.Error("pgstore: worker: outcome refused by the database; recording a failure instead",
				"task", a.task.ID, "attempt", a.task.Attempt, "err", err)
			tr = transition{write: writeFinish, to: StateFailed, results: []byte("[]"),
				err: storableText("pgstore: the outcome could not be stored: " + err.Error())}
			fellBack = true
			continue
		}
		c.logger.Warn("pgstore: worker: writing an outcome failed; retrying",
			"task", a.task.ID, "attempt", a.task.Attempt, "try", try, "err", err)
		c.emit(WorkerEvent{Type: WorkerOutcomeRetry, Kind: a.task.Kind, TaskID: a.task.ID, Attempt: a.task.Attempt, Err: err})
		if !sleep(ctx, backoff) {
			return "", false, err
		}
		backoff = min(2*backoff, c.cfg.Heartbeat)
	}
}

// recordOnce writes tr once, unless the completer has stopped.
func (c *completer) recordOnce(a *attempt, tr transition, try int) (State, bool, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return "", false, errWorkerStopped
	}
	if c.failWrite != nil {
		if err := c.failWrite(a.task, try); err != nil {
			return "", false, err
		}
	}
	ctx, cancel := context.WithTimeout(c.writes, c.cfg.Lease/2)
	defer cancel()
	return c.write(ctx, a.task, a.from, tr)
}

// write runs the statement of tr for attempt t.Attempt, claimed in state
// from, and returns the state it left and whether the fence let it apply.
func (c *completer) write(ctx context.Context, t Task, from State, tr transition) (State, bool, error) {
	args := pgx.NamedArgs{"id": t.ID, "attempt": t.Attempt, "from": from, "error": tr.err}
	var sql string
	switch tr.write {
	case writeNone:
		return "", false, nil
	case writeFinish:
		if tr.results == nil {
			tr.results = []byte("[]")
		}
		if from == StateRunning {
			return c.complete(ctx, &completion{id: t.ID, attempt: t.Attempt, state: tr.to, results: tr.results, err: tr.err})
		}
		sql = sqlFinish
		args["to"], args["results"] = tr.to, tr.results
	case writeRetry:
		sql = sqlRetry
		args["after_us"] = tr.after.Microseconds()
		if tr.after < 0 {
			args["after_us"] = -1
		}
		args["max_attempts"] = c.cfg.MaxAttempts
		args["backoff_base_us"], args["backoff_max_us"], args["jitter"] = c.cfg.BackoffBase.Microseconds(), c.cfg.BackoffMax.Microseconds(), jitter
	case writeUncertain:
		sql = sqlUncertain
		args["after_us"] = c.cfg.ReconcileInterval.Microseconds()
	case writeCancelled:
		sql = sqlEndCancelled
	case writeRelease:
		sql = sqlRelease
		args = pgx.NamedArgs{"id": t.ID, "attempt": t.Attempt, "max_attempts": c.cfg.MaxAttempts,
			"reconcile_us": c.cfg.ReconcileInterval.Microseconds()}
	default:
		return "", false, fmt.Errorf("pgstore: worker: unknown transition %d", tr.write)
	}
	rows, _ := c.pool.Query(ctx, sql, args)
	states, err := pgx.CollectRows(rows, pgx.RowTo[State])
	if err != nil {
		return "", false, interpretError("finish task", err)
	}
	if len(states) == 0 {
		return "", false, nil
	}
	return states[0], true, nil
}

// complete records c through the batching goroutine, or alone when it
// is not running (tests call write directly) or has stopped, and returns
// the task's state after it (cancelled if it was cancelled meanwhile).
func (c *completer) complete(ctx context.Context, x *completion) (State, bool, error) {
	if c.started.Load() {
		x.done = make(chan completed, 1)
		select {
		case c.in <- x:
			r := <-x.done
			return r.state, r.applied, r.err
		case <-c.stopped:
		case <-ctx.Done():
			return "", false, ctx.Err()
		}
	}
	rows, _ := c.pool.Query(ctx, sqlFinish, pgx.NamedArgs{"id": x.id, "attempt": x.attempt, "from": StateRunning,
		"to": x.state, "results": x.results, "error": x.err})
	states, err := pgx.CollectRows(rows, pgx.RowTo[State])
	if err != nil {
		return "", false, interpretError("finish task", err)
	}
	if len(states) == 0 {
		return "", false, nil
	}
	return states[0], true, nil
}

// flush writes a batch in one statement and answers each sender. A batch
// that fails is written one by one, so one bad row cannot hold back the
// others (nor take their outcomes down with it).
func (c *completer) flush(ctx context.Context, batch []*completion) {
	qctx, cancel := context.WithTimeout(ctx, c.cfg.Lease/2)
	defer cancel()
	n := len(batch)
	ids, attempts, states := make([]string, n), make([]int, n), make([]string, n)
	results, errs := make([]string, n), make([]string, n)
	for i, x := range batch {
		ids[i], attempts[i], states[i], results[i], errs[i] = x.id, x.attempt, string(x.state), string(x.results), x.err
	}
	rows, _ := c.pool.Query(qctx, sqlFinishBatch, pgx.NamedArgs{"ids": ids, "attempts": attempts, "states": states,
		"results": results, "errors": errs})
	type row struct {
		ID    string `db:"id"`
		State State  `db:"state"`
	}
	done, err := pgx.CollectRows(rows, pgx.RowToStructByName[row])
	if err != nil && n > 1 {
		for _, x := range batch {
			c.flush(ctx, []*completion{x})
		}
		return
	}
	if err != nil {
		err = interpretError("finish task", err)
	}
	applied := make(map[string]State, len(done))
	for _, r := range done {
		applied[r.ID] = r.State
	}
	for _, x := range batch {
		st, ok := applied[x.id]
		x.done <- completed{state: st, applied: ok, err: err}
	}
}

// jitter is the largest fraction of a backoff taken off at random.
const jitter = 0.5

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
