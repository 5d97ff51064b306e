package pgrecords

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// lazyTx is the handler's transaction. It takes nothing until the
// handler's first statement: then it takes one of the store's
// transaction slots and a pool connection, and BEGIN (with the idle
// limit, see Store.Begin) goes out in front of that statement (Exec,
// Query, QueryRow, SendBatch), in the same round trip. So a handler that
// reads through the pool before writing holds nothing while it does, and
// BEGIN costs no round trip of its own.
//
// Savepoints (Begin) are as lazy: SAVEPOINT waits for the first statement
// in the savepoint and goes out in front of it, a savepoint committed
// queues its RELEASE for the next statement, and one with nothing sent in
// it is dropped. A RELEASE still queued at the commit is dropped too
// (COMMIT commits the savepoints that are still open), so a savepoint
// around the handler's write (pgstore.SubmitTx) costs no round trip.
// ROLLBACK TO SAVEPOINT goes out at once: it must undo a failed
// statement before the next one runs.
//
// The methods that need pgx's own transaction (CopyFrom, LargeObjects,
// Prepare, Conn) get one from conn.Begin after sending what is queued;
// after a BEGIN already sent, its second BEGIN only warns. LargeObjects
// and Conn hand out ways to send statements that bypass the queue: after
// either, savepoints are sent as they are begun and committed.
//
// Every method holds mu while it uses the connection, and close takes it
// too: a statement of a goroutine racing the commit runs before the
// commit (in the transaction) or fails with pgx.ErrTxClosed, never on a
// connection that went back to the pool.
type lazyTx struct {
	s *Store

	mu     sync.Mutex
	closed bool          // the request is over: every method fails
	conn   *pgxpool.Conn // taken with the first statement
	slot   bool          // conn holds one of s.slots
	begun  bool          // BEGIN went out
	// queued are statements without arguments that go out in front of
	// the next one: BEGIN and the setup (SET LOCAL …) until the first,
	// then savepoints' SAVEPOINT and RELEASE.
	queued     []string
	savepoints int    // savepoints begun, for their names
	eager      bool   // LargeObjects or Conn was called: nothing more is queued
	db         pgx.Tx // pgx's transaction, once a method needs it
}

var (
	_ pgx.Tx = (*lazyTx)(nil)
	_ pgx.Tx = (*savepoint)(nil)
)

const sqlBegin = "begin"

// newLazyTx returns a transaction of s whose BEGIN goes out with setup
// ("" for none).
func newLazyTx(s *Store, setup string) *lazyTx {
	t := &lazyTx{s: s, queued: make([]string, 1, 4)}
	t.queued[0] = sqlBegin
	if setup != "" {
		t.queued = append(t.queued, setup)
	}
	return t
}

// usable returns why the transaction cannot be used any more, or nil. mu
// is held.
func (t *lazyTx) usable() error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	if t.begun && t.conn.Conn().PgConn().TxStatus() == 'I' {
		// The handler sent COMMIT or ROLLBACK: what follows would run in
		// autocommit.
		return errEnded
	}
	return nil
}

// use returns the connection, taking a slot and a connection on the first
// call. mu is held.
func (t *lazyTx) use(ctx context.Context) (*pgx.Conn, error) {
	if err := t.usable(); err != nil {
		return nil, err
	}
	if t.conn == nil {
		conn, err := t.s.acquireTx(ctx)
		if err != nil {
			return nil, err
		}
		t.conn, t.slot = conn, true
	}
	return t.conn.Conn(), nil
}

// close ends the handler's use of the transaction, waiting for a method
// in progress, and hands over what it held: the connection (nil if the
// handler sent nothing) and whether BEGIN went out. What is still queued
// is dropped: savepoints with nothing sent in them and RELEASEs, which
// COMMIT and ROLLBACK make needless.
func (t *lazyTx) close() (conn *pgxpool.Conn, slot, begun bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, false, false
	}
	t.closed = true
	conn, slot, begun = t.conn, t.slot, t.begun
	t.conn, t.slot, t.queued = nil, false, nil
	return conn, slot, begun
}

// flush sends what is queued, in one round trip. mu is held.
func (t *lazyTx) flush(ctx context.Context, conn *pgx.Conn) error {
	if len(t.queued) == 0 {
		return nil
	}
	// Statements without arguments go by the simple protocol, which
	// takes several at once.
	queued := slices.Clone(t.queued)
	t.queued = t.queued[:0]
	_, err := conn.Exec(ctx, strings.Join(queued, "; "))
	t.requeue(conn, queued)
	return err
}

// requeue queues again what was sent with queued in front when it left
// no transaction open: a statement that failed before it ran (pgx
// prepares and encodes a batch's statements before running the first)
// ran none of them, and without BEGIN the next statement would run in
// autocommit. mu is held.
func (t *lazyTx) requeue(conn *pgx.Conn, queued []string) {
	if t.begun {
		return
	}
	if conn.PgConn().TxStatus() == 'I' {
		t.queued = append(queued, t.queued...)
		return
	}
	t.begun = true
}

// pgxTx returns pgx's transaction on the connection, with nothing queued.
// mu is held.
func (t *lazyTx) pgxTx(ctx context.Context) (pgx.Tx, error) {
	conn, err := t.use(ctx)
	if err != nil {
		return nil, err
	}
	if t.db == nil {
		begin, queued := sqlBegin, []string(nil)
		if !t.begun {
			// BEGIN and the setup in one round trip.
			queued = slices.Clone(t.queued)
			begin = strings.Join(queued, "; ")
			t.queued = t.queued[:0]
		}
		db, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: begin})
		if err != nil {
			t.requeue(conn, queued)
			return nil, err
		}
		t.db, t.begun = db, true
	}
	if err := t.flush(ctx, conn); err != nil {
		return nil, err
	}
	return t.db, nil
}

// savepoint begins a savepoint. mu is held.
func (t *lazyTx) savepoint(ctx context.Context) (pgx.Tx, error) {
	if err := t.usable(); err != nil {
		return nil, err
	}
	t.savepoints++
	sp := &savepoint{parent: t, name: "sp_" + strconv.Itoa(t.savepoints)}
	t.queued = append(t.queued, "savepoint "+sp.name)
	if t.eager {
		if _, err := t.pgxTx(ctx); err != nil { // sends what is queued
			return nil, err
		}
	}
	return sp, nil
}

func (t *lazyTx) Begin(ctx context.Context) (pgx.Tx, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.savepoint(ctx)
}

func (t *lazyTx) Commit(context.Context) error   { return errTxOwned }
func (t *lazyTx) Rollback(context.Context) error { return errTxOwned }

func (t *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.copyFrom(ctx, table, columns, src)
}

func (t *lazyTx) copyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	db, err := t.pgxTx(ctx)
	if err != nil {
		return 0, err
	}
	return db.CopyFrom(ctx, table, columns, src)
}

// LargeObjects returns pgx's large objects of the transaction; after the
// request, ones whose every call fails (they have no transaction).
func (t *lazyTx) LargeObjects() pgx.LargeObjects {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.largeObjects()
}

func (t *lazyTx) largeObjects() pgx.LargeObjects {
	db, err := t.pgxTx(context.Background())
	if err != nil {
		return pgx.LargeObjects{}
	}
	t.eager = true
	return db.LargeObjects()
}

func (t *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.prepare(ctx, name, sql)
}

func (t *lazyTx) prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	db, err := t.pgxTx(ctx)
	if err != nil {
		return nil, err
	}
	return db.Prepare(ctx, name, sql)
}

// Conn returns the transaction's connection, or nil once the request is
// over. Statements sent on it directly bypass the transaction's guard.
func (t *lazyTx) Conn() *pgx.Conn {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.rawConn()
}

func (t *lazyTx) rawConn() *pgx.Conn {
	if _, err := t.pgxTx(context.Background()); err != nil {
		return nil
	}
	t.eager = true
	return t.conn.Conn()
}

// withQueued returns a batch of what is queued and then queries, and
// what was queued.
func (t *lazyTx) withQueued(queries ...*pgx.QueuedQuery) (*pgx.Batch, []string) {
	queued := slices.Clone(t.queued)
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(queued)+len(queries))}
	for _, sql := range queued {
		b.Queue(sql)
	}
	t.queued = t.queued[:0]
	b.QueuedQueries = append(b.QueuedQueries, queries...)
	return b, queued
}

// sendQueued sends b, whose first statements are queued, and reads their
// results. mu is held.
func (t *lazyTx) sendQueued(ctx context.Context, conn *pgx.Conn, b *pgx.Batch, queued []string) (pgx.BatchResults, error) {
	br := conn.SendBatch(ctx, b)
	for range queued {
		if _, err := br.Exec(); err != nil {
			t.requeue(conn, queued)
			return br, err
		}
		t.begun = true // BEGIN, if queued, was first
	}
	return br, nil
}

func (t *lazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.exec(ctx, sql, args...)
}

func (t *lazyTx) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	conn, err := t.use(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	if len(t.queued) == 0 {
		return conn.Exec(ctx, sql, args...)
	}
	b, queued := t.withQueued(&pgx.QueuedQuery{SQL: sql, Arguments: args})
	br, err := t.sendQueued(ctx, conn, b, queued)
	tag, qerr := br.Exec()
	cerr := br.Close()
	switch {
	case qerr != nil:
		return tag, qerr
	case err != nil:
		return tag, err
	}
	return tag, cerr
}

func (t *lazyTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.query(ctx, sql, args...)
}

func (t *lazyTx) query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	conn, err := t.use(ctx)
	if err != nil {
		return nil, err
	}
	if len(t.queued) == 0 {
		return conn.Query(ctx, sql, args...)
	}
	b, queued := t.withQueued(&pgx.QueuedQuery{SQL: sql, Arguments: args})
	br, err := t.sendQueued(ctx, conn, b, queued)
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

func (t *lazyTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := t.Query(ctx, sql, args...)
	return &row{rows: rows, err: err}
}

func (t *lazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sendBatch(ctx, b)
}

func (t *lazyTx) sendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	conn, err := t.use(ctx)
	if err != nil {
		return &failedBatch{err: err}
	}
	if len(t.queued) == 0 {
		return conn.SendBatch(ctx, b)
	}
	withQueued, queued := t.withQueued(b.QueuedQueries...)
	br, err := t.sendQueued(ctx, conn, withQueued, queued)
	if err != nil {
		return &failedBatch{BatchResults: br, err: err}
	}
	return br
}

// batchRows are the rows of a statement sent after BEGIN in one batch:
// closing them closes the batch.
type batchRows struct {
	pgx.Rows
	br  pgx.BatchResults
	err error
}

func (r *batchRows) Close() {
	if r.br == nil {
		return
	}
	r.Rows.Close()
	r.err = r.br.Close()
	r.br = nil
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// row is QueryRow's answer, as pgx's own: the first row, or
// pgx.ErrNoRows.
type row struct {
	rows pgx.Rows
	err  error
}

func (r *row) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// failedBatch answers every result of a batch that could not go out, or
// whose BEGIN failed, with that failure.
type failedBatch struct {
	pgx.BatchResults // nil when nothing went out
	err              error
}

func (b *failedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b *failedBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b *failedBatch) QueryRow() pgx.Row                { return &row{err: b.err} }
func (b *failedBatch) Close() error {
	if b.BatchResults != nil {
		_ = b.BatchResults.Close()
	}
	return b.err
}

// savepoint is a savepoint of the handler's transaction (lazyTx.Begin),
// or one nested in it, under the transaction's guard; its statements go
// through the transaction's queue.
type savepoint struct {
	parent *lazyTx
	name   string
	done   bool // committed or rolled back
}

// check returns why the savepoint cannot be used any more, or nil. mu is
// held.
func (sp *savepoint) check() error {
	if sp.done {
		return pgx.ErrTxClosed
	}
	return sp.parent.usable()
}

// end ends the savepoint with sql (RELEASE or ROLLBACK TO): nothing at
// all when nothing was sent in it (its SAVEPOINT is still the last
// statement queued), else sql queued, or sent with what is queued when
// now. mu is held.
func (sp *savepoint) end(ctx context.Context, sql string, now bool) error {
	if err := sp.check(); err != nil {
		return err
	}
	sp.done = true
	t := sp.parent
	if n := len(t.queued); n > 0 && t.queued[n-1] == "savepoint "+sp.name {
		t.queued = t.queued[:n-1]
		return nil
	}
	t.queued = append(t.queued, sql+" "+sp.name)
	if !now && !t.eager {
		return nil
	}
	conn, err := t.use(ctx)
	if err != nil {
		return err
	}
	return t.flush(ctx, conn)
}

func (sp *savepoint) Begin(ctx context.Context) (pgx.Tx, error) {
	sp.parent.mu.Lock()
	defer sp.parent.mu.Unlock()
	if err := sp.check(); err != nil {
		return nil, err
	}
	return sp.parent.savepoint(ctx)
}

// Commit releases the savepoint: at once when the transaction is aborted
// (a statement in it failed), to fail as pgx's would; else with the next
// statement.
func (sp *savepoint) Commit(ctx context.Context) error {
	sp.parent.mu.Lock()
	defer sp.parent.mu.Unlock()
	if err := sp.check(); err != nil {
		return err
	}
	t := sp.parent
	aborted := t.begun && t.conn.Conn().PgConn().TxStatus() == 'E'
	return sp.end(ctx, "release savepoint", aborted)
}

// Rollback rolls back to the savepoint at once.
func (sp *savepoint) Rollback(ctx context.Context) error {
	sp.parent.mu.Lock()
	defer sp.parent.mu.Unlock()
	return sp.end(ctx, "rollback to savepoint", true)
}

func (sp *savepoint) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	sp.parent.mu.Lock()
	defer sp.parent.mu.Unlock()
	if err := sp.check(); err != nil {
		return 0, err
	}
	return sp.parent.copyFrom(ctx, table, columns, src)
}

func (sp *savepoint) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	sp.parent.mu.Lock()
	defer sp.parent.mu.Unlock()
	if err := sp.check(); err != nil {
		return &failedBatch{err: err}
	}
	return sp.parent.sendBatch(ctx, b)
}

func (sp *savepoint) LargeObjects() pgx.LargeObjects {
	sp.parent.mu.Lock()
	defer sp.parent.mu.Unlock()
	if sp.check() != nil {
		return pgx.LargeObjects{}
	}
	return sp.parent.largeObjects()
}

func (sp *savepoint) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	sp.parent.mu.Lock()
	defer sp.parent.mu.Unlock()
	if err := sp.check(); err != nil {
		return nil, err
	}
	return sp.parent.prepare(ctx, name, sql)
}

func (sp *savepoint) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	sp.parent.mu.Lock()
	defer sp.parent.mu.Unlock()
	if err := sp.check(); err != nil {
		return pgconn.CommandTag{}, err
	}
	return sp.parent.exec(ctx, sql, args...)
}

func (sp *savepoint) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	sp.parent.mu.Lock()
	defer sp.parent.mu.Unlock()
	if err := sp.check(); err != nil {
		return nil, err
	}
	return sp.parent.query(ctx, sql, args...)
}

func (sp *savepoint) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := sp.Query(ctx, sql, args...)
	return &row{rows: rows, err: err}
}

func (sp *savepoint) Conn() *pgx.Conn {
	sp.parent.mu.Lock()
	defer sp.parent.mu.Unlock()
	if sp.check() != nil {
		return nil
	}
	return sp.parent.rawConn()
}
