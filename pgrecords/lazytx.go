package pgrecords

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// lazyTx is the handler's transaction. BEGIN costs a round trip of its
// own when sent alone, so it is not: it goes out in front of the
// handler's first statement (Exec, Query, QueryRow, SendBatch), in the
// same round trip. The methods that need pgx's own transaction (Begin for
// a savepoint, CopyFrom, LargeObjects, Prepare, Conn) get one from
// conn.Begin; after a BEGIN already sent, its second BEGIN only warns.
type lazyTx struct {
	conn  *pgx.Conn
	begun bool   // BEGIN went out
	db    pgx.Tx // pgx's transaction, once a method needs it
	// ended is set when the request is over and the connection went back
	// to the pool: from then on every method fails with pgx.ErrTxClosed,
	// so that a handler that kept the transaction (a goroutine) cannot
	// run statements on a connection that now serves other requests.
	ended atomic.Bool
}

var _ pgx.Tx = (*lazyTx)(nil)

const sqlBegin = "begin"

// pgxTx returns pgx's transaction on the connection.
func (t *lazyTx) pgxTx(ctx context.Context) (pgx.Tx, error) {
	if t.ended.Load() {
		return nil, pgx.ErrTxClosed
	}
	if t.db == nil {
		db, err := t.conn.Begin(ctx)
		if err != nil {
			return nil, err
		}
		t.db, t.begun = db, true
	}
	return t.db, nil
}

func (t *lazyTx) Begin(ctx context.Context) (pgx.Tx, error) {
	db, err := t.pgxTx(ctx)
	if err != nil {
		return nil, err
	}
	return db.Begin(ctx)
}

func (t *lazyTx) Commit(context.Context) error   { return errTxOwned }
func (t *lazyTx) Rollback(context.Context) error { return errTxOwned }

func (t *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	db, err := t.pgxTx(ctx)
	if err != nil {
		return 0, err
	}
	return db.CopyFrom(ctx, table, columns, src)
}

func (t *lazyTx) LargeObjects() pgx.LargeObjects {
	db, err := t.pgxTx(context.Background())
	if err != nil {
		return pgx.LargeObjects{}
	}
	return db.LargeObjects()
}

func (t *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	db, err := t.pgxTx(ctx)
	if err != nil {
		return nil, err
	}
	return db.Prepare(ctx, name, sql)
}

func (t *lazyTx) Conn() *pgx.Conn {
	if _, err := t.pgxTx(context.Background()); err != nil {
		return nil
	}
	return t.conn
}

func (t *lazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.ended.Load() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	if t.begun {
		return t.conn.Exec(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sqlBegin)
	b.Queue(sql, args...)
	br := t.conn.SendBatch(ctx, b)
	_, err := br.Exec()
	t.begun = err == nil
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
	if t.ended.Load() {
		return nil, pgx.ErrTxClosed
	}
	if t.begun {
		return t.conn.Query(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sqlBegin)
	b.Queue(sql, args...)
	br := t.conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, err
	}
	t.begun = true
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
	if t.ended.Load() {
		return &failedBatch{err: pgx.ErrTxClosed}
	}
	if t.begun {
		return t.conn.SendBatch(ctx, b)
	}
	withBegin := &pgx.Batch{QueuedQueries: append([]*pgx.QueuedQuery{{SQL: sqlBegin}}, b.QueuedQueries...)}
	br := t.conn.SendBatch(ctx, withBegin)
	if _, err := br.Exec(); err != nil {
		return &failedBatch{BatchResults: br, err: err}
	}
	t.begun = true
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

// failedBatch answers every result of a batch whose BEGIN failed with
// that failure.
type failedBatch struct {
	pgx.BatchResults
	err error
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
