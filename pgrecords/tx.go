package pgrecords

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate"
)

var _ idemgate.TxStore = (*Store)(nil)

// TxFromContext returns the transaction that ctx carries on an Atomic
// route (middleware.Config.Atomic, or Runner.Do with Atomic), and true;
// outside one, nil and false. The handler or fn writes through it; the
// engine commits it together with the stored response, or rolls it back.
// Its Commit and Rollback return an error and do nothing. On echo, ctx is
// c.Request().Context().
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	tx, _ := ctx.Value(txKey{}).(*lazyTx)
	if tx == nil {
		return nil, false
	}
	return tx, true
}

type txKey struct{}

// errTxOwned is what a handler gets from Commit or Rollback of its
// request's transaction.
var errTxOwned = errors.New("pgrecords: the transaction of an Atomic route is committed or rolled back by idemgate, not the handler")

// Begin implements idemgate.TxStore: a transaction on a connection of
// the store's pool, in the session's default isolation level. It takes
// nothing yet: the handler's first statement takes a connection, and one
// of the store's transaction slots (the pool's MaxConns less one, so that
// claims and lease renewals always find a connection), and holds both
// until the middleware commits or rolls back. With BEGIN it sets
// idle_in_transaction_session_timeout to twice the route's lease
// (idemgate.TxLease): a node cut off from the database mid-request does
// not keep its row locks from the node that takes its key over for
// longer than that.
func (s *Store) Begin(ctx context.Context) (idemgate.Tx, error) {
	tx := &lazyTx{s: s, setup: []string{sqlMark}}
	if lease, ok := idemgate.TxLease(ctx); ok && lease > 0 {
		if limit := idleLimit(lease); s.idleLimit == 0 || limit < s.idleLimit {
			tx.setup = append(tx.setup, fmt.Sprintf("SET LOCAL idle_in_transaction_session_timeout = %d", limit.Milliseconds()))
		}
	}
	return &atomicTx{tx: tx}, nil
}

// maxIdleLimit is the largest idle_in_transaction_session_timeout
// PostgreSQL accepts: INT_MAX milliseconds, about 24.8 days.
const maxIdleLimit = math.MaxInt32 * time.Millisecond

// idleLimit is how long an Atomic transaction on a route with lease (> 0)
// may sit idle before the server ends its session: twice the lease, at
// least 1ms (0 would disable the limit), at most maxIdleLimit. A lease
// over maxIdleLimit/2 (about 12.4 days, up to math.MaxInt64, where 2*lease
// would overflow) gets maxIdleLimit, not 0 (disabled): a node cut off
// from the database still gives its row locks up after 24.8 days; a
// handler idle inside its transaction for 24.8 days loses it, though its
// lease would have run longer. Begin sets it only when it is lower than
// the limit the pool's sessions start with (Store.idleLimit): a lower one,
// from the server's configuration, is not lifted.
func idleLimit(lease time.Duration) time.Duration {
	if lease > maxIdleLimit/2 {
		return maxIdleLimit
	}
	return max(2*lease, time.Millisecond)
}

// acquireTx takes a transaction slot and a connection for it.
func (s *Store) acquireTx(ctx context.Context) (*pgxpool.Conn, error) {
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		<-s.slots
		return nil, err
	}
	return conn, nil
}

// releaseTx gives back what acquireTx took. The pool closes the
// connection if it is still in a transaction (a rollback that could not
// be sent).
func (s *Store) releaseTx(conn *pgxpool.Conn, slot bool) {
	if conn != nil {
		conn.Release()
	}
	if slot {
		<-s.slots
	}
}

// atomicTx is one Atomic request's transaction. BEGIN goes out with the
// handler's first statement (see lazyTx); a handler that sent none has
// no transaction to commit, and its completion is one statement.
type atomicTx struct {
	tx   *lazyTx
	done bool // Commit or Rollback was called
}

func (t *atomicTx) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, txKey{}, t.tx)
}

// end closes the handler's transaction to it and returns the connection
// (nil if the handler sent nothing) and whether BEGIN went out. The
// caller releases the connection.
func (t *atomicTx) end() (conn *pgxpool.Conn, slot, begun bool, err error) {
	if t.done {
		return nil, false, false, errors.New("transaction already ended")
	}
	t.done = true
	conn, slot, begun = t.tx.close()
	return conn, slot, begun, nil
}

// Commit implements idemgate.Tx. With a completion it sends the
// record's completion and COMMIT in one round trip: if the completion
// finds the claim gone, or the transaction not the one BEGIN opened, the
// server skips the COMMIT, and the transaction is rolled back. Without
// one, the same statement checks the transaction alone.
func (t *atomicTx) Commit(ctx context.Context, c *idemgate.Completion) (err error) {
	conn, slot, begun, err := t.end()
	if err != nil {
		return fmt.Errorf("pgrecords: commit: %w", err)
	}
	defer func() {
		drop(ctx, conn, err)
		t.tx.s.releaseTx(conn, slot)
	}()
	if conn != nil && conn.Conn().IsClosed() {
		// Whatever the handler sent on it was rolled back, BEGIN or not:
		// the completion must not commit on its own.
		return fmt.Errorf("pgrecords: commit: %w", errConnLost)
	}
	if begun {
		if err := handlerEnded(conn); err != nil {
			rollback(ctx, conn)
			return fmt.Errorf("pgrecords: commit: %w", err)
		}
	}
	if c != nil && (c.Response.Status < 100 || c.Response.Status > 999) {
		if begun {
			rollback(ctx, conn)
		}
		return fmt.Errorf("pgrecords: commit: status %d out of range", c.Response.Status)
	}
	if !begun {
		// Nothing of the handler's to commit (its statements, if any,
		// failed before BEGIN ran, on a connection that is still open or
		// was given back: see lazyTx.notBegun): the completion alone, on
		// any connection, as Complete writes it.
		t.tx.s.releaseTx(conn, slot)
		conn, slot = nil, false
		if c == nil {
			return nil
		}
		tag, err := t.tx.s.pool.Exec(ctx, t.tx.s.q.complete, c.Key, uuid(c.Token), micros(c.Retention), appendResponse(nil, c.Response))
		switch {
		case err != nil:
			return fmt.Errorf("pgrecords: commit: complete: %w", err)
		case tag.RowsAffected() != 1:
			return idemgate.ErrLeaseLost
		}
		return nil
	}
	b := &pgx.Batch{}
	b.Queue(sqlResumeStatementTimeout)
	b.Queue(sqlResumeLockTimeout)
	if c == nil {
		b.Queue(t.tx.s.q.commitTx, nil, nil, nil, nil)
	} else {
		b.Queue(t.tx.s.q.commitTx, c.Key, uuid(c.Token), micros(c.Retention), appendResponse(nil, c.Response))
	}
	b.Queue(sqlCommit)
	br := conn.SendBatch(ctx, b)
	// The first error is the one to tell: pgx answers every statement of
	// a batch whose preparation failed with that failure.
	var errComplete error
	for range 3 {
		if _, err := br.Exec(); err != nil && errComplete == nil {
			errComplete = err
		}
	}
	tag, errCommit := br.Exec()
	errClose := br.Close()
	switch {
	case errComplete != nil:
		rollback(ctx, conn)
		return completeError(errComplete)
	case errCommit != nil:
		rollback(ctx, conn)
		return commitError(errCommit)
	case errClose != nil:
		rollback(ctx, conn)
		return fmt.Errorf("pgrecords: commit: %w", errClose)
	case tag.String() != "COMMIT":
		return fmt.Errorf("pgrecords: commit: the transaction was rolled back (%s)", tag)
	}
	return nil
}

// completeError is what Commit returns when the completion failed with
// err: the transaction is rolled back (the COMMIT behind it skipped), or
// its outcome is unknown when err is not the server's answer.
func completeError(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return fmt.Errorf("pgrecords: commit: complete: %w", err)
	}
	switch pgErr.Code {
	case "IG001":
		return idemgate.ErrLeaseLost
	case "IG002":
		return fmt.Errorf("pgrecords: commit: %w", errNotOurs)
	case "25006": // read_only_sql_transaction
		return fmt.Errorf("pgrecords: commit: %w: %w", errReadOnly, err)
	case "42501": // insufficient_privilege
		return fmt.Errorf("pgrecords: commit: %w: %w", errNoRights, err)
	case "40001", "40P01":
		return fmt.Errorf("pgrecords: commit: complete: %w: %w", idemgate.ErrTxConflict, err)
	case "26000": // invalid_sql_statement_name
		// The store's prepared statement is gone from the session: the
		// handler dropped them (DISCARD ALL, DEALLOCATE ALL).
		return fmt.Errorf("pgrecords: commit: %w: %w", errSessionReset, err)
	case "42883": // undefined_function
		return fmt.Errorf("pgrecords: commit: complete: %w (the records table is older than this code: run Store.Migrate)", err)
	}
	return fmt.Errorf("pgrecords: commit: complete: %w", err)
}

// commitError is what Commit returns when its COMMIT failed with err. An
// error the server answered (short of one that ends the session) means
// that it rolled the transaction back: a serialization failure or a
// deadlock, which a retry may not meet again (ErrTxConflict); a failure
// of the server's or of its state of the moment (storeClasses: a
// connection, resources, a lock not available, a cancellation or an
// administrator's shutdown, an I/O or internal error), the store's; any
// other is the handler's own writes failing what runs at COMMIT (a
// deferred foreign key or other constraint, class 23; a deferred
// constraint trigger that raised, class P0, or failed on the handler's
// data, class 22 such as 22012 division by zero, or on its rights, class
// 42): it fails the same way on every retry, so it is the handler's
// failure (ErrTxRefused), not an outage to retry. An error the server
// did not answer (a connection that broke, a FATAL one) is the store's,
// its outcome possibly unknown.
func commitError(err error) error {
	var pgErr *pgconn.PgError
	switch {
	case !errors.As(err, &pgErr), pgErr.Severity == "FATAL", pgErr.Severity == "PANIC":
	case pgErr.Code == "40001", pgErr.Code == "40P01":
		return fmt.Errorf("pgrecords: commit: %w: %w", idemgate.ErrTxConflict, err)
	case !storeFailure(pgErr.Code):
		return fmt.Errorf("pgrecords: commit: %w: %w", idemgate.ErrTxRefused, err)
	}
	return fmt.Errorf("pgrecords: commit: %w", err)
}

// storeClasses are the SQLSTATE classes of a failure that is the
// server's, or its state's at that moment, rather than the data's: a
// retry may not meet it again.
var storeClasses = []string{
	"08", // connection exception
	"25", // invalid transaction state
	"40", // transaction rollback (40001 and 40P01 are conflicts; 40003 statement completion unknown)
	"53", // insufficient resources (disk full, out of memory, too many connections)
	"55", // object not in prerequisite state (55P03 lock not available, 55006 object in use)
	"57", // operator intervention (57014 query canceled, 57P01 admin shutdown, …)
	"58", // system error (I/O)
	"72", // snapshot failure
	"F0", // configuration file error
	"HV", // foreign data wrapper error (a remote server's trouble)
	"XX", // internal error
}

// storeFailure reports whether SQLSTATE code is of a storeClasses class,
// but 40002 (transaction integrity constraint violation: the data's). A
// code that is no SQLSTATE is the store's.
func storeFailure(code string) bool {
	switch {
	case code == "40002":
		return false
	case len(code) != 5:
		return true
	}
	return slices.Contains(storeClasses, code[:2])
}

// Rollback implements idemgate.Tx. It asks, in the ROLLBACK's round
// trip, whether the transaction is still the one BEGIN opened: a handler
// that committed it with a COMMIT statement and began another broke it.
func (t *atomicTx) Rollback(ctx context.Context) (err error) {
	conn, slot, begun, err := t.end()
	if err != nil {
		return nil
	}
	defer func() {
		drop(ctx, conn, err)
		t.tx.s.releaseTx(conn, slot)
	}()
	if !begun || conn.Conn().IsClosed() {
		// Nothing to roll back, or the server did when the session ended.
		return nil
	}
	switch conn.Conn().PgConn().TxStatus() {
	case 'I':
		return fmt.Errorf("pgrecords: rollback: %w", errEnded)
	case 'E':
		// Aborted: no statement but ROLLBACK runs.
		if _, err := conn.Exec(ctx, sqlRollback); err != nil {
			return fmt.Errorf("pgrecords: rollback: %w", err)
		}
		return nil
	}
	b := &pgx.Batch{}
	b.Queue(sqlMarked)
	b.Queue(sqlRollback)
	br := conn.SendBatch(ctx, b)
	var marked bool
	errMarked := br.QueryRow().Scan(&marked)
	_, errRollback := br.Exec()
	if err := errors.Join(errMarked, errRollback, br.Close()); err != nil {
		return fmt.Errorf("pgrecords: rollback: %w", err)
	}
	if !marked {
		return fmt.Errorf("pgrecords: rollback: %w", errNotOurs)
	}
	return nil
}

var (
	errEnded        = fmt.Errorf("%w: it sent COMMIT or ROLLBACK itself, so what it wrote before may have committed", idemgate.ErrTxAborted)
	errNotOurs      = fmt.Errorf("%w: it ended the transaction the store opened and began another (COMMIT or ROLLBACK, then BEGIN, as SQL), or reset its settings (RESET ALL); what it wrote before may have committed", idemgate.ErrTxAborted)
	errAborted      = fmt.Errorf("%w: a statement of the handler's failed (the transaction is aborted), yet it answered", idemgate.ErrTxAborted)
	errConnLost     = fmt.Errorf("%w: its connection closed while a statement of the handler's was on it (the transaction, if BEGIN ran, is rolled back), yet it answered", idemgate.ErrTxAborted)
	errSessionReset = fmt.Errorf("%w: it dropped the session's prepared statements (DISCARD ALL, DEALLOCATE ALL), so the completion could not run", idemgate.ErrTxAborted)
	errReadOnly     = fmt.Errorf("%w: it made its transaction read-only (SET TRANSACTION READ ONLY), so the answer cannot be stored in it", idemgate.ErrTxAborted)
	errNoRights     = fmt.Errorf("%w: the role it set (SET ROLE) cannot call the completion: it needs USAGE on the records table's schema and EXECUTE on idemgate_records_commit_tx", idemgate.ErrTxAborted)
)

// handlerEnded returns why the transaction that BEGIN opened on conn
// cannot commit through the handler's doing, or nil: the server's
// transaction status says whether it is still open ('T'), aborted ('E')
// or ended ('I').
func handlerEnded(conn *pgxpool.Conn) error {
	switch conn.Conn().PgConn().TxStatus() {
	case 'I':
		return errEnded
	case 'E':
		return errAborted
	}
	return nil
}

// drop closes conn when err says that the handler ran statements outside
// the store's transaction (it sent COMMIT or ROLLBACK, began another) or
// dropped the session's prepared statements: what it did to the session
// there (DISCARD ALL, a SET of the session, temporary objects) is
// unknown, and pgx's statement cache may no longer match the server's, so
// the connection must serve no later request. The pool drops a closed
// connection when it is released. A transaction that is merely aborted
// (a statement of the handler's failed) leaves the session as it was.
func drop(ctx context.Context, conn *pgxpool.Conn, err error) {
	if conn == nil || !(errors.Is(err, errEnded) || errors.Is(err, errNotOurs) || errors.Is(err, errSessionReset)) {
		return
	}
	_ = conn.Conn().Close(ctx)
}

// rollback rolls back the transaction still open on conn, if it can: one
// it cannot leaves the pool with the connection.
func rollback(ctx context.Context, conn *pgxpool.Conn) {
	pc := conn.Conn().PgConn()
	if !pc.IsClosed() && !pc.IsBusy() && pc.TxStatus() != 'I' {
		_, _ = conn.Exec(ctx, sqlRollback)
	}
}
