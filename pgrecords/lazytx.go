package pgrecords

import (
	"context"
	"errors"
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
// Query, QueryRow, SendBatch), in the same round trip (but for a
// statement given a pgx.QueryExecMode: see execMode). So a handler that
// reads through the pool before writing holds nothing while it does, and
// BEGIN costs no round trip of its own. The methods that need pgx's own
// transaction (Begin for a savepoint, CopyFrom, LargeObjects, Prepare,
// Conn) get one from conn.Begin; after a BEGIN already sent, its second
// BEGIN only warns, and goes without the setup (the mark is set once, in
// the transaction the store opened, never again).
//
// Every method holds mu while it uses the connection, and close takes it
// too: a statement of a goroutine racing the commit runs before the
// commit (in the transaction) or fails with pgx.ErrTxClosed, never on a
// connection that went back to the pool.
type lazyTx struct {
	s     *Store
	setup []string // sent with BEGIN: SET LOCAL statements

	mu     sync.Mutex
	closed bool          // the request is over: every method fails
	conn   *pgxpool.Conn // taken with the first statement
	slot   bool          // conn holds one of s.slots
	begun  bool          // BEGIN went out
	db     pgx.Tx        // pgx's transaction, once a method needs it
}

var (
	_ pgx.Tx = (*lazyTx)(nil)
	_ pgx.Tx = (*savepoint)(nil)
)

const sqlBegin = "begin"

// use returns the connection, taking a slot and a connection on the first
// call. mu is held.
func (t *lazyTx) use(ctx context.Context) (*pgx.Conn, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	if t.conn == nil {
		conn, err := t.s.acquireTx(ctx)
		if err != nil {
			return nil, err
		}
		t.conn, t.slot = conn, true
	}
	conn := t.conn.Conn()
	if t.begun && !conn.IsClosed() && conn.PgConn().TxStatus() == 'I' {
		// The handler sent COMMIT or ROLLBACK: what follows would run in
		// autocommit.
		return nil, errEnded
	}
	return conn, nil
}

// close ends the handler's use of the transaction, waiting for a method
// in progress, and hands over what it held: the connection (nil if the
// handler sent nothing) and whether BEGIN went out.
func (t *lazyTx) close() (conn *pgxpool.Conn, slot, begun bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, false, false
	}
	t.closed = true
	conn, slot, begun = t.conn, t.slot, t.begun
	t.conn, t.slot = nil, false
	return conn, slot, begun
}

// pgxTx returns pgx's transaction on the connection. mu is held.
func (t *lazyTx) pgxTx(ctx context.Context) (pgx.Tx, error) {
	conn, err := t.use(ctx)
	if err != nil {
		return nil, err
	}
	if t.db == nil {
		// pgx closes the connection when BEGIN fails without the server's
		// answer, even with a context that was done before anything was
		// sent, where a savepoint of pgx's own transaction sends nothing
		// and leaves the transaction usable.
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// BEGIN and the setup in one round trip: a statement without
		// arguments goes by the simple protocol, which takes several.
		begin := t.simpleBegin()
		if t.begun {
			// BEGIN went out with a statement of the handler's: a second
			// one only warns. The setup must not go again: the handler may
			// have ended the store's transaction and begun another
			// (ROLLBACK; BEGIN), which the mark would then pass off as the
			// store's, and the answer would commit without its writes.
			begin = sqlBegin
		}
		db, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: begin})
		if err != nil {
			return nil, err
		}
		t.db, t.begun = db, true
	}
	return t.db, nil
}

func (t *lazyTx) Begin(ctx context.Context) (pgx.Tx, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	db, err := t.pgxTx(ctx)
	if err != nil {
		return nil, err
	}
	sp, err := db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &savepoint{parent: t, tx: sp}, nil
}

func (t *lazyTx) Commit(context.Context) error   { return errTxOwned }
func (t *lazyTx) Rollback(context.Context) error { return errTxOwned }

func (t *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	db, err := t.pgxTx(ctx)
	if err != nil {
		return 0, err
	}
	return db.CopyFrom(ctx, table, columns, src)
}

// LargeObjects returns the large objects of the transaction. Their calls,
// and those of the large objects they open, go through the transaction's
// guard: after the request they fail with pgx.ErrTxClosed and send
// nothing.
func (t *lazyTx) LargeObjects() pgx.LargeObjects { return largeObjects(t) }

func (t *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
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
	if _, err := t.pgxTx(context.Background()); err != nil {
		return nil
	}
	return t.conn.Conn()
}

// simpleBegin is BEGIN and the setup as one string, for the simple
// protocol.
func (t *lazyTx) simpleBegin() string {
	return sqlBegin + "; " + strings.Join(t.setup, "; ")
}

// begin returns a batch of BEGIN, the setup and then queries.
func (t *lazyTx) begin(queries ...*pgx.QueuedQuery) (*pgx.Batch, int) {
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 1+len(t.setup)+len(queries))}
	b.Queue(sqlBegin)
	for _, q := range t.setup {
		b.Queue(q)
	}
	n := len(b.QueuedQueries)
	b.QueuedQueries = append(b.QueuedQueries, queries...)
	return b, n
}

// sendBegin sends b, whose first n statements are BEGIN and the setup,
// and reads their results. mu is held.
func (t *lazyTx) sendBegin(ctx context.Context, conn *pgx.Conn, b *pgx.Batch, n int) (pgx.BatchResults, error) {
	br := conn.SendBatch(ctx, b)
	for i := range n {
		if _, err := br.Exec(); err != nil {
			return br, err
		}
		if i == 0 {
			t.begun = true
		}
	}
	return br, nil
}

// notBegun is called, mu held, when the batch that carried BEGIN failed
// with err, once the batch is closed; first is the handler's first
// statement in it, as pgx sent it, and open whether the connection was
// open when the batch went out.
//
// pgx prepares a batch's new statements (a round trip of Parse and
// Describe, nothing run), then encodes the arguments of each statement
// and queues it in its pipeline, and sends them all, synced, only once
// every one is encoded. When an encoding fails (a value too large for its
// type, a wrong argument count: pgx.ErrPreprocessingBatch, step "build"),
// what was queued in front of the failing statement is unsynced, so pgx
// closes the connection (pgconn's Pipeline.Close: "pipeline has unsynced
// requests"; its asyncClose sends what was queued with a Terminate behind
// it, and the server rolls back what ran when the session ends; a plain
// Exec encodes before it queues anything). On the first statement, what was
// queued is only BEGIN and the setup: a plain pgx transaction, whose BEGIN
// ran before on its own, keeps its connection and stays usable after the
// same error, and so does this one. The connection goes back to the pool,
// which drops it, with the slot; the handler's next statement takes
// another, BEGIN in front. The normal path costs nothing more.
//
// When a statement of the handler's was queued in front of the failing
// one (a batch), pgx closes its connection in a plain transaction too;
// any other failure that closed the connection (a statement that outlived
// its context, a broken link) may have run BEGIN and more before it: the
// connection stays closed, the handler's next statements fail on it, as
// in pgx, and Commit refuses to complete the record (errConnLost). So
// does one that was closed before the batch (a BEGIN that pgxTx sent
// outlived its context), though the encoding fails on it the same way
// when pgx has the batch's statements cached and sends nothing to prepare
// them (TestTxConnectionLostStaysLostAfterEncodeError).
func (t *lazyTx) notBegun(err error, first string, open bool) {
	var pre pgx.ErrPreprocessingBatch
	if !open || t.begun || t.conn == nil || !t.conn.Conn().IsClosed() ||
		!errors.As(err, &pre) || !strings.HasPrefix(pre.Error(), "error preprocessing batch (build)") || pre.SQL() != first {
		return
	}
	t.s.releaseTx(t.conn, t.slot)
	t.conn, t.slot = nil, false
}

func (t *lazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	conn, err := t.use(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	if t.begun {
		return conn.Exec(ctx, sql, args...)
	}
	if execMode(args) {
		if _, err := t.pgxTx(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		return conn.Exec(ctx, sql, args...)
	}
	if len(args) == 0 && strings.Contains(sql, ";") {
		return t.execSimple(ctx, conn, sql)
	}
	q := &pgx.QueuedQuery{SQL: sql, Arguments: args}
	b, n := t.begin(q)
	open := !conn.IsClosed()
	br, err := t.sendBegin(ctx, conn, b, n)
	tag, qerr := br.Exec()
	cerr := br.Close()
	switch {
	case qerr != nil:
		err = qerr
	case err == nil:
		err = cerr
	}
	if err != nil {
		t.notBegun(err, q.SQL, open)
	}
	return tag, err
}

// execMode reports whether args begin with a pgx.QueryExecMode among
// the options pgx's Exec and Query take in front of the arguments (a
// QueryRewriter such as pgx.NamedArgs is the other). A batch takes no
// mode (it would be sent as an argument), so a first statement with one
// does not go out behind BEGIN in a batch: BEGIN and the setup go first,
// in a round trip of their own, as pgx's own transaction sends them, and
// the statement runs as pgx runs it (TestTxFirstStatementWithExecMode).
func execMode(args []any) bool {
	for _, a := range args {
		switch a.(type) {
		case pgx.QueryExecMode:
			return true
		case pgx.QueryRewriter:
			continue
		}
		return false
	}
	return false
}

// execSimple is the handler's first statement when it is an Exec of
// several statements without arguments (or one with a semicolon in it),
// which pgx sends by the simple protocol: a batch would prepare it, and
// the server refuses to prepare more than one statement. BEGIN and the
// setup go in front of it in the same string, so in the same round trip.
// A statement of it that fails aborts the transaction, as in a plain pgx
// transaction, whose BEGIN ran before. mu is held.
//
// It reads the results as pgx's Exec does (the last command's tag), and
// counts them: the server answers each statement as it completes, BEGIN
// first, so an error the server answered with no result before it ran
// nothing (a syntax error: the server parses the whole string first),
// and BEGIN ran when one result came. The error and the transaction
// status alone cannot tell: a statement of the handler's that fails as it
// is analysed, after its own ROLLBACK (`INSERT …; ROLLBACK; INSERT INTO t
// (a) VALUES (1, 2)`, 42601 too), leaves the connection idle as a syntax
// error does, and the next statement would have sent BEGIN and the mark
// again, or the answer have been completed on its own, its write rolled
// back (TestTxAnswerNeverStoredWithoutItsWrites). The query tracer of the
// connection's configuration, if any, sees the statement as pgx's Exec
// would show it.
func (t *lazyTx) execSimple(ctx context.Context, conn *pgx.Conn, sql string) (tag pgconn.CommandTag, err error) {
	sql = t.simpleBegin() + "; " + sql
	tracer := conn.Config().Tracer
	if tracer != nil {
		ctx = tracer.TraceQueryStart(ctx, conn, pgx.TraceQueryStartData{SQL: sql})
	}
	mrr := conn.PgConn().Exec(ctx, sql)
	results := 0
	for mrr.NextResult() {
		results++
		tag, _ = mrr.ResultReader().Close()
	}
	err = mrr.Close()
	if tracer != nil {
		tracer.TraceQueryEnd(ctx, conn, pgx.TraceQueryEndData{CommandTag: tag, Err: err})
	}
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && results == 0 && conn.PgConn().TxStatus() == 'I':
		// The server answered an error before BEGIN's result: it ran
		// nothing, BEGIN neither.
	case err == nil, results > 0, pgErr != nil, conn.IsClosed(), conn.PgConn().TxStatus() != 'I':
		// The server ran BEGIN, or may have: the connection closed with
		// the string on it.
		t.begun = true
	}
	return tag, err
}

func (t *lazyTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	conn, err := t.use(ctx)
	if err != nil {
		return nil, err
	}
	if t.begun {
		return conn.Query(ctx, sql, args...)
	}
	if execMode(args) {
		if _, err := t.pgxTx(ctx); err != nil {
			return nil, err
		}
		return conn.Query(ctx, sql, args...)
	}
	q := &pgx.QueuedQuery{SQL: sql, Arguments: args}
	b, n := t.begin(q)
	open := !conn.IsClosed()
	br, err := t.sendBegin(ctx, conn, b, n)
	if err != nil {
		_ = br.Close()
		t.notBegun(err, q.SQL, open)
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
	conn, err := t.use(ctx)
	if err != nil {
		return &failedBatch{err: err}
	}
	if t.begun {
		return conn.SendBatch(ctx, b)
	}
	withBegin, n := t.begin(b.QueuedQueries...)
	open := !conn.IsClosed()
	br, err := t.sendBegin(ctx, conn, withBegin, n)
	if err != nil {
		// Nothing after BEGIN and the setup ran: every result is err.
		_ = br.Close()
		first := ""
		if len(withBegin.QueuedQueries) > n {
			first = withBegin.QueuedQueries[n].SQL
		}
		t.notBegun(err, first, open)
		return &failedBatch{err: err}
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
type failedBatch struct{ err error }

func (b *failedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b *failedBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b *failedBatch) QueryRow() pgx.Row                { return &row{err: b.err} }
func (b *failedBatch) Close() error                     { return b.err }
func (b *failedBatch) Tx() pgx.Tx                       { return nil }

// savepoint is a savepoint of the handler's transaction (lazyTx.Begin),
// or one nested in it, under the transaction's guard: pgx's own would go
// on sending statements on the connection after the request.
type savepoint struct {
	parent *lazyTx
	tx     pgx.Tx
}

// check returns why the savepoint cannot be used any more, or nil. mu is
// held.
func (sp *savepoint) check() error {
	if sp.parent.closed {
		return pgx.ErrTxClosed
	}
	if sp.parent.conn.Conn().PgConn().TxStatus() == 'I' {
		return errEnded
	}
	return nil
}

func (sp *savepoint) Begin(ctx context.Context) (pgx.Tx, error) {
	sp.parent.mu.Lock()
	defer sp.parent.mu.Unlock()
	if err := sp.check(); err != nil {
		return nil, err
	}
	tx, err := sp.tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &savepoint{parent: sp.parent, tx: tx}, nil
}

func (sp *savepoint) Commit(ctx context.Context) error {
	sp.parent.mu.Lock()
	defer sp.parent.mu.Unlock()
	if err := sp.check(); err != nil {
		return err
	}
	return sp.tx.Commit(ctx)
}

func (sp *savepoint) Rollback(ctx context.Context) error {
	sp.parent.mu.Lock()
	defer sp.parent.mu.Unlock()
	if err := sp.check(); err != nil {
		return err
	}
	return sp.tx.Rollback(ctx)
}

func (sp *savepoint) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	sp.parent.mu.Lock()
	defer sp.parent.mu.Unlock()
	if err := sp.check(); err != nil {
		return 0, err
	}
	return sp.tx.CopyFrom(ctx, table, columns, src)
}

func (sp *savepoint) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	sp.parent.mu.Lock()
	defer sp.parent.mu.Unlock()
	if err := sp.check(); err != nil {
		return &failedBatch{err: err}
	}
	return sp.tx.SendBatch(ctx, b)
}

// LargeObjects returns the large objects of the savepoint, under the
// transaction's guard (see lazyTx.LargeObjects).
func (sp *savepoint) LargeObjects() pgx.LargeObjects { return largeObjects(sp) }

func (sp *savepoint) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	sp.parent.mu.Lock()
	defer sp.parent.mu.Unlock()
	if err := sp.check(); err != nil {
		return nil, err
	}
	return sp.tx.Prepare(ctx, name, sql)
}

func (sp *savepoint) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	sp.parent.mu.Lock()
	defer sp.parent.mu.Unlock()
	if err := sp.check(); err != nil {
		return pgconn.CommandTag{}, err
	}
	return sp.tx.Exec(ctx, sql, args...)
}

func (sp *savepoint) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	sp.parent.mu.Lock()
	defer sp.parent.mu.Unlock()
	if err := sp.check(); err != nil {
		return nil, err
	}
	return sp.tx.Query(ctx, sql, args...)
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
	return sp.tx.Conn()
}
