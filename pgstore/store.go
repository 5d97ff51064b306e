package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	// ErrConflict reports that the idempotency key is held by a task with
	// another owner, kind or fingerprint. It is the same error whichever of
	// the three differs, and it carries nothing of the stored task.
	ErrConflict = errors.New("pgstore: idempotency key held by a task with other parameters")

	// ErrNotFound reports that no task with that ID belongs to the caller.
	// Another caller's task is not found either: Get never reveals that it
	// exists.
	ErrNotFound = errors.New("pgstore: task not found")

	// ErrFinished reports that Cancel found the task already finished
	// (succeeded or failed): it changed nothing.
	ErrFinished = errors.New("pgstore: task already finished")

	// ErrNotRecoverable reports that Recover refused a task; the wrapping
	// error says why (not failed, no partial results, recovered too often).
	ErrNotRecoverable = errors.New("pgstore: task cannot be recovered")
)

// MaxRecoveries is how many times Recover puts one task back in line.
const MaxRecoveries = 3

// submitTries bounds how often Submit runs its statement again when the
// row holding its key is not visible yet (committed after the statement's
// snapshot was taken, or being inserted while the key index is rebuilt).
const submitTries = 5

// State is where a task is in its lifecycle.
type State string

// The states of a task. Pending, running, retrying and uncertain are
// unfinished: a client keeps polling the same task ID. Succeeded, failed
// and cancelled are final, except that Recover may move a failed task
// that kept partial results back to retrying.
const (
	StatePending   State = "pending"   // accepted, waiting for a worker
	StateRunning   State = "running"   // a worker holds a lease on it
	StateRetrying  State = "retrying"  // an attempt ended; runs again after a backoff
	StateUncertain State = "uncertain" // the upstream outcome is unknown; only reconciliation resolves it
	StateSucceeded State = "succeeded" // final, with results
	StateFailed    State = "failed"    // final, with an error (and perhaps partial results)
	StateCancelled State = "cancelled" // final: Store.Cancel ended it
)

// NewTask is what Submit stores. Tenant, Owner, Kind, IdempotencyKey and
// Fingerprint must not be empty; Runtime and Network may be.
//
// RunAfter and Priority say when and in which order workers take the
// task. They are not part of its identity: a duplicate Submit returns the
// stored task with the RunAfter and Priority it was first given.
type NewTask struct {
	Tenant         string
	Owner          string // who may read the task (keyspace Key.Owner())
	Kind           string
	Runtime        string
	Network        string
	IdempotencyKey string // keyspace Key.Task()
	Fingerprint    string
	Params         json.RawMessage // any JSON value, or nil; stored as jsonb
	// Trace is an opaque W3C traceparent of the request that submitted
	// the task, so that an attempt's span can link to it. Optional.
	Trace string
	// RunAfter is the earliest time a worker may claim the task. Optional.
	// Default: now (the database's clock). A time already past is stored
	// as now: the task does not go ahead of those submitted before it. A
	// task given any RunAfter is not announced to listening workers: they
	// find it by polling, within their PollInterval of its time. A time
	// after year 9999 (UTC) is refused: Postgres cannot store every
	// time.Time.
	RunAfter time.Time
	// Priority orders the runnable tasks of a kind: higher first, and the
	// oldest first within one priority. Optional. Default 0. It must fit
	// in 16 bits (MinPriority to MaxPriority).
	Priority int
}

// The range of NewTask.Priority (it is stored as a smallint).
const (
	MinPriority = math.MinInt16
	MaxPriority = math.MaxInt16
)

// Task is a stored task. Params and Results are stored as jsonb and read
// back in its formatting (object keys reordered, whitespace normalized):
// the same values, not the same bytes.
type Task struct {
	ID             string            `db:"id"` // opaque
	Tenant         string            `db:"tenant"`
	Owner          string            `db:"owner"`
	Kind           string            `db:"kind"`
	Runtime        string            `db:"runtime"`
	Network        string            `db:"network"`
	IdempotencyKey string            `db:"idempotency_key"`
	Fingerprint    string            `db:"fingerprint"`
	Params         json.RawMessage   `db:"params"`
	Trace          string            `db:"trace"` // NewTask.Trace
	State          State             `db:"state"`
	Attempt        int               `db:"attempt"`    // claims so far: the fencing token of the current one
	Recoveries     int               `db:"recoveries"` // times Recover put it back in line
	Results        []json.RawMessage `db:"results"`    // final results, or partial ones of a failed task
	Error          string            `db:"error"`      // why it failed, or the last attempt's error
	RunAfter       time.Time         `db:"run_after"`  // when it may run (again)
	Priority       int               `db:"priority"`   // NewTask.Priority
	CreatedAt      time.Time         `db:"created_at"`
	UpdatedAt      time.Time         `db:"updated_at"`
	Duplicate      bool              `db:"duplicate"` // Submit returned an existing task
}

// Store is the Postgres task store. It is safe for concurrent use, and any
// number of Stores in any number of processes may share one database.
type Store struct {
	pool *pgxpool.Pool

	// elapsed is monotonic time since the Store was made: the clock of
	// the NOTIFY rate limit, which a step of the wall clock cannot stop.
	elapsed func() time.Duration
	// announce limits Submit's NOTIFYs to one per kind per notifyEvery.
	announce notifyLimiter
	// listed remembers the lines SubmitTx listed lately (see listLine).
	listed listedLines
	// arbiter is the unique index Submit and SubmitMany name last worked.
	arbiter arbiter

	test *storeTestHooks // nil except in this package's tests
}

// storeTestHooks are seams for this package's tests; production code
// never sets them.
type storeTestHooks struct {
	// migrateStep runs before each migration step with the migrating
	// connection's backend PID (a test kills it there).
	migrateStep func(ctx context.Context, step string, pid uint32)
	// migrateSkip lists versions Migrate leaves out (a test applies them
	// later, as a node of an older release would have).
	migrateSkip []int
}

// querier is what Submit needs of a pool or a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

var (
	_ querier = (*pgxpool.Pool)(nil)
	_ querier = (pgx.Tx)(nil)
)

// New returns a Store on pool, which may point at an empty database: call
// Migrate before the first Submit. New checks that the server is reachable
// and is PostgreSQL 13 or newer.
func New(ctx context.Context, pool *pgxpool.Pool) (*Store, error) {
	if pool == nil {
		return nil, errors.New("pgstore: new: nil pool")
	}
	var version int
	if err := pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return nil, fmt.Errorf("pgstore: new: %w", err)
	}
	if version < 130000 {
		return nil, fmt.Errorf("pgstore: new: PostgreSQL %d.%d is too old (13 or newer needed)", version/10000, version%10000)
	}
	return newStore(pool), nil
}

func newStore(pool *pgxpool.Pool) *Store {
	epoch := time.Now()
	return &Store{pool: pool, elapsed: func() time.Duration { return time.Since(epoch) }}
}

// notifyEvery is the least time between two NOTIFYs of one kind from one
// Store's Submit. A NOTIFY serializes commits database-wide (Postgres
// takes a global lock from pre-commit to commit end), so Submit announces
// a burst of new tasks once instead of per task; a worker claims again
// notifyRecheck after the last notification it got, to catch the rest.
const (
	notifyEvery   = 25 * time.Millisecond
	notifyRecheck = 4 * notifyEvery
)

// notifyLimiter decides which Submits announce their task: the first of
// a kind, then one per notifyEvery. Times are monotonic offsets, passed
// in (as x/time/rate does), so no wall clock is involved.
type notifyLimiter struct {
	mu   sync.Mutex
	last map[string]time.Duration // kind → when it was last announced
}

// due reports whether a task of kind submitted at now needs announcing.
func (l *notifyLimiter) due(kind string, now time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	last, ok := l.last[kind]
	return !ok || now-last >= notifyEvery
}

// sent records that a NOTIFY for kind went out with a commit at now.
func (l *notifyLimiter) sent(kind string, now time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last = map[string]time.Duration{}
	}
	if last, ok := l.last[kind]; !ok || now > last {
		l.last[kind] = now
	}
}

// Submit stores t, or returns the task that already holds its key
// (tenant, idempotency key, runtime, network) with Duplicate set. A held
// key whose owner, kind or fingerprint differ (compared byte for byte)
// is ErrConflict. Any number of concurrent identical Submits, from any
// number of processes, create one task and all get its ID.
//
// A new task wakes listening workers: its statement sends a NOTIFY that is
// delivered when it commits (bursts are announced at most once per 25ms
// per kind, and workers poll as well).
func (s *Store) Submit(ctx context.Context, t NewTask) (Task, error) {
	now := s.elapsed()
	notify := s.announce.due(t.Kind, now)
	got, err := submit(ctx, s.pool, &s.arbiter, t, notify, false)
	// A task scheduled for later was announced only if its time had come:
	// it does not hold back the next task's announcement.
	if err == nil && notify && !got.Duplicate && t.RunAfter.IsZero() {
		s.announce.sent(t.Kind, now)
	}
	return got, err
}

// SubmitTx is Submit inside the caller's transaction, so a handler can
// enqueue follow-up work atomically with its own writes. The task (and
// its notification) exists only if tx commits. It runs under a savepoint,
// so a unique violation met while the key index is being rebuilt does not
// abort tx. It works under every isolation level, but under REPEATABLE
// READ or SERIALIZABLE a concurrent duplicate (the same key submitted by
// a transaction that committed after tx's snapshot) surfaces as a
// serialization failure (SQLSTATE 40001), and so, under SERIALIZABLE, may
// a conflict Postgres' serializable checks find among tx's reads and
// writes: the savepoint is rolled back, and the caller rolls tx back and
// runs it again, as for any serialization failure. The listing of the
// task's line (below) never fails tx: a line another transaction listed
// after tx's snapshot counts as listed (schema v11).
//
// Before the task, it lists the task's line (kind, priority, tenant) for
// the claim of capped tenants (schema v9) in a statement of its own,
// committed at once, so that tx does not hold a new line's row, which
// other transactions listing the same line would wait for (see
// sqlListLine). That listing never makes SubmitTx wait: when the pool has
// no connection to spare (every one may be held by a handler's
// transaction, tx included) or the line's row is held by an open
// transaction (tx itself, when its own SQL listed the line), it is
// skipped and tx lists the line, as every writer's trigger does.
func (s *Store) SubmitTx(ctx context.Context, tx pgx.Tx, t NewTask) (Task, error) {
	if err := t.validate(); err != nil {
		return Task{}, err
	}
	s.listLine(ctx, t)
	return submit(ctx, tx, &s.arbiter, t, true, true)
}

// SubmitTx's listing of a line waits at most listLineConnWait for a
// connection of the pool (a pool with room may have to dial one; one
// without room is not asked) and listLineLockWait for the line's row;
// past either, the caller's transaction lists the line itself.
const (
	listLineConnWait = 2 * time.Second
	listLineLockWait = 100 * time.Millisecond
)

// listLine lists t's line outside the caller's transaction when it can
// do so at once. It only spares other transactions a wait: the trigger
// of the caller's transaction lists the line whatever happens here, so
// an error is not the caller's.
func (s *Store) listLine(ctx context.Context, t NewTask) {
	line := waitingLine{Kind: t.Kind, Priority: int16(t.Priority), Tenant: t.Tenant}
	start := s.elapsed()
	if s.listed.recent(line, start) {
		return
	}
	if st := s.pool.Stat(); st.AcquiredConns() >= st.MaxConns() {
		return // the caller's own transaction may hold the last one
	}
	actx, cancel := context.WithTimeout(ctx, listLineConnWait)
	conn, err := s.pool.Acquire(actx)
	cancel()
	if err != nil {
		return
	}
	defer conn.Release()
	b := &pgx.Batch{}
	b.Queue(`BEGIN ISOLATION LEVEL READ COMMITTED`) // the upsert waits for a row, then reads it
	b.Queue(fmt.Sprintf(`SET LOCAL lock_timeout = %d`, listLineLockWait.Milliseconds()))
	b.Queue(sqlListLine, pgx.NamedArgs{"kind": t.Kind, "priority": t.Priority, "tenant": t.Tenant})
	b.Queue(`COMMIT`)
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		// A lock timeout aborted the transaction and its COMMIT rolled
		// it back; a cancel may have left the connection in any state.
		if !conn.Conn().PgConn().IsClosed() && conn.Conn().PgConn().TxStatus() != 'I' {
			conn.Conn().Close(context.Background()) //nolint:errcheck // the pool replaces it
		}
		return
	}
	s.listed.add(line, start)
}

// A line SubmitTx listed is stamped at most 30 s before the listing, and
// the sweep leaves a line stamped in the last minute (sweepMinAge): for
// listedFor after its listing was sent, the line's row exists and SubmitTx
// need not list it again, which spares every SubmitTx of a busy line a
// round trip. Nothing depends on it for correctness: were the row gone,
// the caller's transaction would list the line itself.
const (
	listedFor = 20 * time.Second
	listedMax = 4096 // lines remembered; past it, the memory starts over
)

// listedLines is the set of lines a Store listed lately, by the Store's
// monotonic clock.
type listedLines struct {
	mu   sync.Mutex
	seen map[waitingLine]time.Duration
}

// recent reports whether line was listed less than listedFor before now.
func (l *listedLines) recent(line waitingLine, now time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.seen[line]
	return ok && now-at < listedFor
}

// add records that line's listing was sent at at.
func (l *listedLines) add(line waitingLine, at time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil || len(l.seen) >= listedMax {
		l.seen = make(map[waitingLine]time.Duration)
	}
	l.seen[line] = at
}

func submit(ctx context.Context, q querier, a *arbiter, t NewTask, notify, savepoints bool) (Task, error) {
	if err := t.validate(); err != nil {
		return Task{}, err
	}
	var params any // nil ⇒ SQL NULL
	if len(t.Params) > 0 {
		params = []byte(t.Params)
	}
	args := pgx.NamedArgs{"tenant": t.Tenant, "owner": t.Owner, "kind": t.Kind, "runtime": t.Runtime,
		"network": t.Network, "key": t.IdempotencyKey, "fingerprint": t.Fingerprint, "params": params,
		"trace": storableText(t.Trace), "run_after": runAfterArg(t.RunAfter), "priority": t.Priority,
		"notify": notify, "key_digest": t.digest()}
	var serialization error
	for range submitTries {
		got, found, err := submitOnce(ctx, q, a, args, savepoints)
		if err != nil && !savepoints && sqlState(err) == codeSerializationFailure {
			// A statement of its own, under a REPEATABLE READ or
			// SERIALIZABLE default, met a holder committed after its
			// snapshot: the next statement's snapshot sees it.
			serialization = err
			continue
		}
		if err != nil {
			return Task{}, err
		}
		if !found {
			continue // the holder is not visible to this snapshot yet
		}
		if got.Duplicate && plant != "skip-readback" && (got.Owner != t.Owner || got.Kind != t.Kind || got.Fingerprint != t.Fingerprint) {
			return Task{}, ErrConflict
		}
		return got, nil
	}
	if serialization != nil {
		return Task{}, serialization
	}
	return Task{}, fmt.Errorf("pgstore: submit: key is held, but no task with the full key (tenant, key, runtime, network) "+
		"became visible after %d tries (a task of another runtime or network holds it while the narrow v1 index is in force?)", submitTries)
}

// submitOnce runs the submit statement once; found is false when the key
// is held by a row this snapshot cannot see.
func submitOnce(ctx context.Context, q querier, a *arbiter, args pgx.NamedArgs, savepoints bool) (Task, bool, error) {
	onColumns := a.columns.Load()
	got, found, err := run(ctx, q, savepoints, submitStatement(onColumns), args)
	if missingArbiter(err) {
		onColumns = !onColumns
		got, found, err = run(ctx, q, savepoints, submitStatement(onColumns), args)
		if !missingArbiter(err) {
			a.columns.Store(onColumns)
		}
	}
	if err == nil {
		return got, found, nil
	}
	if !missingArbiter(err) {
		return readBackOnViolation(ctx, q, args, err, savepoints, onColumns)
	}
	// No valid unique index matches either conflict target, i.e. the
	// schema is still v1 or v2's index is being built. Insert plainly and
	// let a unique violation name the index that caught it.
	got, found, err = run(ctx, q, savepoints, sqlSubmitPlain, args)
	if err == nil {
		return got, found, nil
	}
	return readBackOnViolation(ctx, q, args, err, savepoints, true)
}

// readBackOnViolation turns a unique violation on one of the key indexes
// into a read-back of the row by its full key, found by its digest or, if
// onColumns (before v12), by its columns.
func readBackOnViolation(ctx context.Context, q querier, args pgx.NamedArgs, err error, savepoints, onColumns bool) (Task, bool, error) {
	if !isUniqueViolation(err, indexKeyNarrow, indexKeyWide, indexKeyDigest) {
		return Task{}, false, interpretError("submit", err)
	}
	byKey := sqlByKey
	if onColumns {
		byKey = sqlByKeyWide
	}
	got, found, err := run(ctx, q, savepoints, byKey, pgx.NamedArgs{"tenant": args["tenant"], "key": args["key"],
		"runtime": args["runtime"], "network": args["network"], "key_digest": args["key_digest"]})
	if err != nil {
		return Task{}, false, interpretError("submit: read back", err)
	}
	return got, found, nil
}

// run queries for at most one task, under a savepoint when asked so that
// an error leaves the caller's transaction usable.
func run(ctx context.Context, q querier, savepoint bool, sql string, args ...any) (Task, bool, error) {
	if !savepoint {
		return queryTask(ctx, q, sql, args...)
	}
	sp, err := q.(pgx.Tx).Begin(ctx)
	if err != nil {
		return Task{}, false, err
	}
	got, found, err := queryTask(ctx, sp, sql, args...)
	if err != nil {
		_ = sp.Rollback(ctx)
		return Task{}, false, err
	}
	return got, found, sp.Commit(ctx)
}

// queryTaskAlone is queryTask of a statement that is a transaction of
// its own, run again on a serialization failure: under a REPEATABLE READ
// or SERIALIZABLE default, a row the statement waited for and found
// changed by a transaction that committed after its snapshot fails it
// (40001), where READ COMMITTED would have read the row again; the next
// statement's snapshot sees the change.
func queryTaskAlone(ctx context.Context, q querier, sql string, args ...any) (t Task, found bool, err error) {
	for range submitTries {
		t, found, err = queryTask(ctx, q, sql, args...)
		if sqlState(err) != codeSerializationFailure {
			break
		}
	}
	return t, found, err
}

// queryTask returns the first task the query yields, if any.
func queryTask(ctx context.Context, q querier, sql string, args ...any) (Task, bool, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return Task{}, false, err
	}
	t, err := pgx.CollectOneRow(rows, pgx.RowToStructByName[Task])
	if errors.Is(err, pgx.ErrNoRows) {
		return Task{}, false, nil
	}
	if err != nil {
		return Task{}, false, err
	}
	return t, true, nil
}

func (t NewTask) validate() error {
	for _, f := range []struct{ name, v string }{
		{"tenant", t.Tenant}, {"owner", t.Owner}, {"kind", t.Kind},
		{"idempotency key", t.IdempotencyKey}, {"fingerprint", t.Fingerprint},
	} {
		if f.v == "" {
			return fmt.Errorf("%w: empty %s", ErrInvalidTask, f.name)
		}
	}
	if t.Priority < MinPriority || t.Priority > MaxPriority {
		return fmt.Errorf("%w: priority %d outside [%d, %d]", ErrInvalidTask, t.Priority, MinPriority, MaxPriority)
	}
	// Postgres stores 4713 BC to 294276 AD and refuses the rest, which in
	// SubmitMany would fail the whole batch. Before year 1 is as good as
	// now; after 9999 is a bug in the caller.
	if t.RunAfter.UTC().Year() >= 10000 {
		return fmt.Errorf("%w: run after %s, want before year 10000", ErrInvalidTask, t.RunAfter.UTC().Format(time.RFC3339))
	}
	return t.checkStorable()
}

// runAfterArg is NewTask.RunAfter as a query argument: NULL (now) when zero.
func runAfterArg(at time.Time) pgtype.Timestamptz {
	if at.UTC().Year() < 1 { // before Postgres's first time too, maybe: due now
		at = time.Time{}
	}
	return pgtype.Timestamptz{Time: at, Valid: !at.IsZero()}
}

// Get returns the task with that ID if it belongs to tenant and owner, and
// ErrNotFound otherwise, whether or not the task exists for someone else.
func (s *Store) Get(ctx context.Context, tenant, owner, id string) (Task, error) {
	return s.get(ctx, scope{tenant: tenant, owner: owner}, id)
}

// scope is whose tasks a call may see: one tenant's owner's, or, for an
// Operator, everyone's.
type scope struct {
	tenant, owner string
	operator      bool
}

func (sc scope) args(id string) pgx.NamedArgs {
	return pgx.NamedArgs{"id": id, "tenant": sc.tenant, "owner": sc.owner, "operator": sc.operator}
}

func (s *Store) get(ctx context.Context, sc scope, id string) (Task, error) {
	if !validID(id) {
		return Task{}, ErrNotFound
	}
	t, found, err := queryTask(ctx, s.pool, sqlGet, sc.args(id))
	if err != nil {
		return Task{}, interpretError("get", err)
	}
	if !found {
		return Task{}, ErrNotFound
	}
	return t, nil
}

// Recover moves a failed task that kept partial results back to retrying,
// on the same task ID, at most MaxRecoveries times; workers then run it
// again and its handler sees the partial results in Task.Results. Any
// other task is refused with an error wrapping ErrNotRecoverable that says
// why; another caller's task is ErrNotFound.
func (s *Store) Recover(ctx context.Context, tenant, owner, id string) (Task, error) {
	if !validID(id) {
		return Task{}, ErrNotFound
	}
	t, found, err := queryTaskAlone(ctx, s.pool, sqlRecover, pgx.NamedArgs{"id": id, "tenant": tenant, "owner": owner,
		"max_recoveries": MaxRecoveries})
	if err != nil {
		return Task{}, interpretError("recover", err)
	}
	if found {
		return t, nil
	}
	// Nothing changed: read the task to say why.
	cur, err := s.Get(ctx, tenant, owner, id)
	if err != nil {
		return Task{}, fmt.Errorf("pgstore: recover: %w", err)
	}
	var why string
	switch {
	case cur.State != StateFailed:
		why = fmt.Sprintf("task is %s, not failed", cur.State)
	case realItems(cur.Results) == nil:
		why = "task failed without partial results; submit a new request"
	case cur.Recoveries >= MaxRecoveries:
		why = fmt.Sprintf("task was recovered %d times already", cur.Recoveries)
	default:
		why = "task changed concurrently; try again"
	}
	return Task{}, fmt.Errorf("%w: %s", ErrNotRecoverable, why)
}

// Cancel ends an unfinished task (pending, running, retrying or
// uncertain) as cancelled, a final state, and returns it. A running
// attempt of it is told at once (LISTEN/NOTIFY) and its handler's
// context is cancelled; whatever it returns is discarded. Cancel is
// idempotent: a cancelled task is returned as it is. A task that already
// succeeded or failed is not changed: Cancel returns it with an error
// wrapping ErrFinished. Another caller's task is ErrNotFound.
func (s *Store) Cancel(ctx context.Context, tenant, owner, id string) (Task, error) {
	return s.cancel(ctx, scope{tenant: tenant, owner: owner}, id)
}

func (s *Store) cancel(ctx context.Context, sc scope, id string) (Task, error) {
	if !validID(id) {
		return Task{}, ErrNotFound
	}
	t, found, err := queryTaskAlone(ctx, s.pool, sqlCancel, sc.args(id))
	if err != nil {
		return Task{}, interpretError("cancel", err)
	}
	if found {
		return t, nil
	}
	cur, err := s.get(ctx, sc, id)
	if err != nil {
		return Task{}, fmt.Errorf("pgstore: cancel: %w", err)
	}
	if cur.State == StateCancelled {
		return cur, nil
	}
	return cur, fmt.Errorf("pgstore: cancel: task %s: %w", cur.State, ErrFinished)
}

// pruneBatch bounds how many rows one Prune statement deletes, so no
// statement holds many row locks or runs long.
const pruneBatch = 1000

// Prune deletes tasks that finished (succeeded, failed or cancelled)
// more than olderThan ago, in batches of a thousand rows, and returns how
// many it deleted.
// Unfinished tasks are never pruned (Stats shows how old they get).
//
// A pruned task's key is free again: a retry of its request would make a
// new task. So olderThan must be at least the retention of whatever
// answers retries before they reach Submit (the middleware's Retention):
// then no client can still be replayed the task when it goes. Safe to run
// from several nodes at once.
func (s *Store) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	var total int64
	for {
		tag, err := s.pool.Exec(ctx, sqlPrune, pgx.NamedArgs{"older_us": olderThan.Microseconds(), "limit": pruneBatch})
		if err != nil {
			return total, interpretError("prune", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < pruneBatch {
			return total, nil
		}
	}
}

// validID reports whether id can name a task (a UUID), so that a malformed
// ID is ErrNotFound without a round trip.
func validID(id string) bool {
	var u pgtype.UUID
	return len(id) == 36 && u.Scan(id) == nil
}
