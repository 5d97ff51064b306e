package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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
// unfinished: a client keeps polling the same task ID. Succeeded and
// failed are final, except that Recover may move a failed task that kept
// partial results back to retrying.
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
}

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
	CreatedAt      time.Time         `db:"created_at"`
	UpdatedAt      time.Time         `db:"updated_at"`
	Duplicate      bool              `db:"duplicate"` // Submit returned an existing task
}

// Store is the Postgres task store. It is safe for concurrent use, and any
// number of Stores in any number of processes may share one database.
type Store struct {
	pool *pgxpool.Pool
	now  func() time.Time

	// lastNotify is when Submit last announced a new task, per kind, in
	// Unix nanoseconds of now.
	lastNotify sync.Map // kind → *atomic.Int64

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
	return &Store{pool: pool, now: time.Now}
}

// notifyEvery is the least time between two NOTIFYs of one kind from one
// Store's Submit. A NOTIFY serializes commits database-wide (Postgres
// takes a global lock from pre-commit to commit end), so Submit announces
// a burst of new tasks once instead of per task; a woken worker claims
// again notifyRecheck later to catch the rest of the burst.
const (
	notifyEvery   = 25 * time.Millisecond
	notifyRecheck = 4 * notifyEvery
)

// shouldNotify reports whether a new task of kind needs announcing.
func (s *Store) shouldNotify(kind string) bool {
	v, ok := s.lastNotify.Load(kind)
	if !ok {
		return true
	}
	return s.now().UnixNano()-v.(*atomic.Int64).Load() >= int64(notifyEvery)
}

// notified records that a NOTIFY for kind went out with a commit.
func (s *Store) notified(kind string) {
	v, _ := s.lastNotify.LoadOrStore(kind, new(atomic.Int64))
	v.(*atomic.Int64).Store(s.now().UnixNano())
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
	notify := s.shouldNotify(t.Kind)
	got, err := submit(ctx, s.pool, t, notify, false)
	if err == nil && notify && !got.Duplicate {
		s.notified(t.Kind)
	}
	return got, err
}

// SubmitTx is Submit inside the caller's transaction, so a handler can
// enqueue follow-up work atomically with its own writes. The task (and
// its notification) exists only if tx commits. It runs under a savepoint,
// so a unique violation met while the key index is being rebuilt does not
// abort tx. Use it under READ COMMITTED: under REPEATABLE READ or
// SERIALIZABLE a concurrent duplicate surfaces as a serialization failure
// the caller must retry.
func (s *Store) SubmitTx(ctx context.Context, tx pgx.Tx, t NewTask) (Task, error) {
	return submit(ctx, tx, t, true, true)
}

func submit(ctx context.Context, q querier, t NewTask, notify, savepoints bool) (Task, error) {
	if err := t.validate(); err != nil {
		return Task{}, err
	}
	var params any // nil ⇒ SQL NULL
	if len(t.Params) > 0 {
		params = []byte(t.Params)
	}
	args := []any{t.Tenant, t.Owner, t.Kind, t.Runtime, t.Network, t.IdempotencyKey, t.Fingerprint, params, notify, t.Trace}
	for range submitTries {
		got, found, err := submitOnce(ctx, q, args, savepoints)
		if err != nil {
			return Task{}, err
		}
		if !found {
			continue // the holder is not visible to this snapshot yet
		}
		if got.Duplicate && (got.Owner != t.Owner || got.Kind != t.Kind || got.Fingerprint != t.Fingerprint) {
			return Task{}, ErrConflict
		}
		return got, nil
	}
	return Task{}, fmt.Errorf("pgstore: submit: key is held, but no task with the full key (tenant, key, runtime, network) "+
		"became visible after %d tries (a task of another runtime or network holds it while the narrow v1 index is in force?)", submitTries)
}

// submitOnce runs the submit statement once; found is false when the key
// is held by a row this snapshot cannot see.
func submitOnce(ctx context.Context, q querier, args []any, savepoints bool) (Task, bool, error) {
	got, found, err := run(ctx, q, savepoints, sqlSubmit, args...)
	if err == nil {
		return got, found, nil
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P10" {
		return readBackOnViolation(ctx, q, args, err, savepoints)
	}
	// 42P10: no valid unique index matches the conflict target, i.e. the
	// schema is still v1 or v2's index is being built. Insert plainly and
	// let a unique violation name the index that caught it.
	got, found, err = run(ctx, q, savepoints, sqlSubmitPlain, args...)
	if err == nil {
		return got, found, nil
	}
	return readBackOnViolation(ctx, q, args, err, savepoints)
}

// readBackOnViolation turns a unique violation on one of the key indexes
// into a read-back of the row by its full key.
func readBackOnViolation(ctx context.Context, q querier, args []any, err error, savepoints bool) (Task, bool, error) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" ||
		(pgErr.ConstraintName != indexKeyNarrow && pgErr.ConstraintName != indexKeyWide) {
		return Task{}, false, interpretError("submit", err)
	}
	got, found, err := run(ctx, q, savepoints, sqlByKey, args[0], args[5], args[3], args[4])
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
			return fmt.Errorf("pgstore: submit: empty %s", f.name)
		}
	}
	return nil
}

// Get returns the task with that ID if it belongs to tenant and owner, and
// ErrNotFound otherwise, whether or not the task exists for someone else.
func (s *Store) Get(ctx context.Context, tenant, owner, id string) (Task, error) {
	if !validID(id) {
		return Task{}, ErrNotFound
	}
	t, found, err := queryTask(ctx, s.pool, sqlGet, id, tenant, owner)
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
	t, found, err := queryTask(ctx, s.pool, sqlRecover, id, tenant, owner, MaxRecoveries)
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
	case len(cur.Results) == 0:
		why = "task failed without partial results; submit a new request"
	case cur.Recoveries >= MaxRecoveries:
		why = fmt.Sprintf("task was recovered %d times already", cur.Recoveries)
	default:
		why = "task changed concurrently; try again"
	}
	return Task{}, fmt.Errorf("%w: %s", ErrNotRecoverable, why)
}

// pruneBatch bounds how many rows one Prune statement deletes, so no
// statement holds many row locks or runs long.
const pruneBatch = 1000

// Prune deletes tasks that finished (succeeded or failed) more than
// olderThan ago, in batches of a thousand rows, and returns how many it
// deleted. Unfinished tasks are never pruned. Safe to run from several
// nodes at once.
func (s *Store) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	var total int64
	for {
		tag, err := s.pool.Exec(ctx, sqlPrune, olderThan.Microseconds(), pruneBatch)
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

// interpretError wraps a database error for the operation op; it is the
// one place where errors are translated.
func interpretError(op string, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42P01": // undefined_table
			return fmt.Errorf("pgstore: %s: schema missing (run Migrate): %w", op, err)
		case "22P02": // invalid_text_representation: Params is not JSON
			return fmt.Errorf("pgstore: %s: params: %w", op, err)
		}
	}
	return fmt.Errorf("pgstore: %s: %w", op, err)
}
