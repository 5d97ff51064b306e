package middleware

import (
	"context"
	"time"
)

// TxStore is a Store that can run a handler inside a database transaction
// and finish the handler's record in that same transaction, so that the
// handler's own writes and its stored response commit together or not at
// all (Config.Atomic). pgrecords.Store implements it; RedisStore cannot,
// since Redis cannot commit together with the application's database.
type TxStore interface {
	Store

	// Begin opens a transaction for one request. The middleware calls it
	// after a successful Claim (or, for a request without an idempotency
	// key, without one), hands the transaction to the handler through the
	// request's context (Tx.Context), and ends it with exactly one Commit
	// or Rollback.
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
	// effect. Any other error may leave the outcome unknown (the
	// connection broke while the commit was on its way).
	Commit(ctx context.Context, c *Completion) error

	// Rollback rolls the transaction back. It is the only call after a
	// handler that failed, and harmless after a Commit that failed.
	Rollback(ctx context.Context) error
}

// Completion is what Tx.Commit writes to the record in the transaction:
// what Store.Complete writes outside one.
type Completion struct {
	Key       string
	Token     Token
	Response  Response
	Retention time.Duration
}
