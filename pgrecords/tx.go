package pgrecords

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/middleware"
)

var _ middleware.TxStore = (*Store)(nil)

// Tx returns the transaction of the request c on an Atomic route
// (middleware.Config.Atomic), or nil outside one. The handler writes
// through it; the middleware commits it together with the stored response,
// or rolls it back. Its Commit and Rollback return an error and do nothing.
func Tx(c echo.Context) pgx.Tx { return TxFromContext(c.Request().Context()) }

// TxFromContext returns the transaction that ctx, a request's context on
// an Atomic route, carries, or nil: Tx for code that has only the context.
func TxFromContext(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey{}).(*lazyTx)
	if tx == nil {
		return nil
	}
	return tx
}

type txKey struct{}

// errTxOwned is what a handler gets from Commit or Rollback of its
// request's transaction.
var errTxOwned = errors.New("pgrecords: the transaction of an Atomic route is committed or rolled back by the middleware, not the handler")

// Begin implements middleware.TxStore: a transaction on a connection of
// the store's pool, in the session's default isolation level, held until
// the middleware commits or rolls it back. Lease renewals run on other
// connections of the pool meanwhile, so the pool needs more connections
// than Atomic requests run at once.
func (s *Store) Begin(ctx context.Context) (middleware.Tx, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgrecords: begin: %w", err)
	}
	return &atomicTx{conn: conn, tx: &lazyTx{conn: conn.Conn()}}, nil
}

// atomicTx is one Atomic request's transaction. BEGIN goes out with the
// handler's first statement (see lazyTx); a handler that sent none has
// no transaction to commit, and its completion is one statement.
type atomicTx struct {
	conn *pgxpool.Conn
	tx   *lazyTx
	done bool // the connection went back to the pool
}

func (t *atomicTx) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, txKey{}, t.tx)
}

// Commit implements middleware.Tx. With a completion it sends the
// record's completion and COMMIT in one round trip: if the completion
// finds the claim gone, the server skips the COMMIT, and the transaction
// is rolled back.
func (t *atomicTx) Commit(ctx context.Context, c *middleware.Completion) error {
	if t.done {
		return errors.New("pgrecords: commit: transaction already ended")
	}
	if c == nil {
		if !t.tx.begun {
			t.end()
			return nil
		}
		tag, err := t.conn.Exec(ctx, sqlCommit)
		if err != nil {
			_ = t.Rollback(ctx)
			return fmt.Errorf("pgrecords: commit: %w", err)
		}
		t.end()
		if tag.String() != "COMMIT" {
			return fmt.Errorf("pgrecords: commit: the transaction was rolled back (%s)", tag)
		}
		return nil
	}
	if c.Response.Status < 100 || c.Response.Status > 999 {
		_ = t.Rollback(ctx)
		return fmt.Errorf("pgrecords: commit: status %d out of range", c.Response.Status)
	}
	response := appendResponse(nil, c.Response)
	if !t.tx.begun || t.escaped() {
		// Nothing of the handler's to commit: the completion alone. (Or
		// the handler ended the transaction itself with a COMMIT
		// statement: its writes are in, and the record must say so.)
		_, err := t.conn.Exec(ctx, sqlCompleteTx, c.Key, uuid(c.Token), micros(c.Retention), response)
		t.end()
		switch {
		case leaseLost(err):
			return middleware.ErrLeaseLost
		case err != nil:
			return fmt.Errorf("pgrecords: commit: complete: %w", err)
		}
		return nil
	}
	b := &pgx.Batch{}
	b.Queue(sqlCompleteTx, c.Key, uuid(c.Token), micros(c.Retention), response)
	b.Queue(sqlCommit)
	br := t.conn.SendBatch(ctx, b)
	_, errComplete := br.Exec()
	tag, errCommit := br.Exec()
	errClose := br.Close()
	switch {
	case errComplete != nil:
		_ = t.Rollback(ctx)
		if leaseLost(errComplete) {
			return middleware.ErrLeaseLost
		}
		return fmt.Errorf("pgrecords: commit: complete: %w", errComplete)
	case errCommit != nil || errClose != nil:
		_ = t.Rollback(ctx)
		return fmt.Errorf("pgrecords: commit: %w", errors.Join(errCommit, errClose))
	case tag.String() != "COMMIT":
		// The server rolled the transaction back at COMMIT (it had failed
		// before, e.g. a handler's statement whose error it ignored).
		t.end()
		return fmt.Errorf("pgrecords: commit: the transaction was rolled back (%s)", tag)
	}
	t.end()
	return nil
}

// Rollback implements middleware.Tx.
func (t *atomicTx) Rollback(ctx context.Context) error {
	if t.done {
		return nil
	}
	var err error
	switch {
	case t.tx.begun && t.escaped():
		err = errEscaped
	case t.tx.begun:
		_, err = t.conn.Exec(ctx, sqlRollback)
	}
	t.end()
	if err != nil {
		return fmt.Errorf("pgrecords: rollback: %w", err)
	}
	return nil
}

// errEscaped is a rollback of a transaction the handler ended itself.
var errEscaped = errors.New("the handler ended its transaction itself (a COMMIT or ROLLBACK statement): what it wrote before may have committed")

// escaped reports whether the transaction that BEGIN opened is no longer
// open on the connection: the handler sent COMMIT or ROLLBACK itself.
func (t *atomicTx) escaped() bool {
	return t.conn.Conn().PgConn().TxStatus() == 'I'
}

// end gives the connection back to the pool, which closes it if it is
// still in a transaction (a rollback that could not be sent).
func (t *atomicTx) end() {
	if !t.done {
		t.done = true
		t.tx.ended.Store(true)
		t.conn.Release()
	}
}

// leaseLost reports whether err is idemgate_records_complete_tx finding
// the claim gone (SQLSTATE IG001).
func leaseLost(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "IG001"
}
