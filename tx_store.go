package idemgate

import (
	"context"
	"errors"
	"time"

	"github.com/idemgate/idemgate/internal/txlease"
)

// TxStore is a Store that can run a handler inside a database transaction
// and finish the handler's record in that same transaction, so that the
// handler's own writes and its stored response commit together or not at
// all (Config.Atomic). pgrecords.Store implements it; redisstore.Store cannot,
// since Redis cannot commit together with the application's database.
type TxStore interface {
	Store

	// Begin opens a transaction for one request. The middleware calls it
	// after a successful Claim (or, for a request without an idempotency
	// key, without one), hands the transaction to the handler through the
	// request's context (Tx.Context), and ends it with exactly one Commit
	// or Rollback. ctx carries the route's Lease (TxLease).
	Begin(ctx context.Context) (Tx, error)
}

// Tx is the transaction of one request on an Atomic route. The middleware
// owns it: the handler writes through it but neither commits nor rolls it
// back.
type Tx interface {
	// Context returns a copy of ctx that carries the transaction, for the
	// handler and the code below it (e.g. pgrecords.TxFromContext).
	Context(ctx context.Context) context.Context

	// Commit commits the transaction. With a non-nil Completion it first
	// finishes the record, in the transaction, if and only if the record
	// is still claimed with the completion's token at that moment by the
	// store's clock (not at the transaction's start); otherwise it rolls
	// back and returns ErrLeaseLost, and nothing of the transaction takes
	// effect. It returns ErrTxAborted, committing nothing, when the
	// handler left the transaction unable to commit, and ErrTxRefused or
	// ErrTxConflict when the database rolled it back at the commit. Any
	// other error may leave the outcome unknown (the connection broke
	// while the commit was on its way).
	Commit(ctx context.Context, c *Completion) error

	// Rollback rolls the transaction back. It is the only call after a
	// handler that failed, and harmless after a Commit that failed. It
	// returns ErrTxAborted when the handler ended the transaction itself.
	Rollback(ctx context.Context) error
}

// ErrTxAborted is what Tx.Commit and Tx.Rollback return (wrapped) when the
// handler, not the store, broke the transaction: a statement of its failed
// and it answered as if it had not (the transaction is aborted), or it
// ended the transaction itself with a COMMIT or ROLLBACK statement. The
// middleware answers 500 transaction_aborted (not to be retried) and
// releases the claim; nothing is stored.
var ErrTxAborted = errors.New("idemgate: the handler aborted or ended its transaction")

// ErrTxRefused is what Tx.Commit returns (wrapped, with the database's
// error) when the database refused to commit what the handler wrote and
// rolled it back: a constraint or constraint trigger checked at COMMIT
// (DEFERRABLE INITIALLY DEFERRED) failed on the handler's data, as it
// would on every retry. The middleware answers it as the handler's error
// (echo's error handler sees the database's error), with x-should-retry:
// false, and releases the claim.
var ErrTxRefused = errors.New("idemgate: the database refused to commit the handler's transaction")

// ErrTxConflict is what Tx.Commit returns (wrapped, with the database's
// error) when the database rolled the transaction back for a concurrent
// one's sake (a serialization failure, a deadlock), which a retry may not
// meet again. The middleware releases the claim and answers 503
// transaction_conflict with Retry-After.
var ErrTxConflict = errors.New("idemgate: the handler's transaction conflicted with another and was rolled back")

// TxLease returns the Lease of the route whose transaction TxStore.Begin
// opens, which Begin's ctx carries. A store bounds with it how long a
// transaction may sit idle: a node cut off from its database must not
// hold the transaction's locks long after its claim ran out.
func TxLease(ctx context.Context) (time.Duration, bool) {
	return txlease.From(ctx)
}

// Completion is what Tx.Commit writes to the record in the transaction:
// what Store.Complete writes outside one.
type Completion struct {
	Key       string
	Token     Token
	Response  Response
	Retention time.Duration
}
