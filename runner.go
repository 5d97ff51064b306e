package idemgate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/txlease"
	"github.com/idemgate/idemgate/keyspace"
)

// Runner runs work that is not an HTTP request — a queue message handled
// at least once, a scheduled job, a webhook's side effect — once per
// idempotency key, on the same state machine as the HTTP doors: claim,
// lease renewal, complete or release, fencing, replay, wait in flight,
// and, with Atomic, one transaction for the work's writes and its record.
// A Runner is a value: copy it freely; Do validates it on every call.
type Runner struct {
	// Store keeps the claims and the stored results, e.g. redisstore.New
	// or pgrecords.New.
	// Required.
	Store Store

	// Kind names the work, e.g. "charge"; it matches
	// [a-z0-9][a-z0-9_-]{0,63}. Keys of different kinds never collide.
	// Required: there is no route to derive it from.
	Kind string

	// Fingerprint selects the fields of params (a JSON document) that take
	// part in the fingerprint. With Fields, ErrKeyReused's error also
	// names the fields that changed, when the store keeps their digests
	// (the Redis store and pgrecords do).
	// Optional. Default: the whole of params.
	Fingerprint fingerprint.Spec

	// Lease is how long a claim lives without renewal. It is renewed every
	// Lease/3 while fn runs, so it bounds how long a crashed worker blocks
	// a redelivery.
	// Optional. Default 30s.
	Lease time.Duration

	// Retention is how long a finished result is kept for replay: at least
	// as long as the queue may redeliver a message.
	// Optional. Default 24h.
	Retention time.Duration

	// WaitInFlight is how long Do waits for another run holding its key
	// before it returns ErrInProgress; when the other run finishes in time,
	// Do returns its result, replayed.
	// Optional. Default 0: return ErrInProgress at once.
	WaitInFlight time.Duration

	// Atomic runs fn inside a transaction that the Store opens after the
	// claim, and finishes the record in that same transaction: fn's
	// writes through the transaction (pgrecords.TxFromContext) and its
	// stored result commit together, or neither does. The Store must
	// implement TxStore (pgrecords.Store does; the Redis store cannot).
	// Optional. Default false.
	Atomic bool

	// OnEvent receives an Event for each step of each run, as the HTTP
	// doors' do, with Do's context without its cancellation. A Do event's
	// Route is empty and its Kind is Runner.Kind. It must be fast and safe
	// for concurrent use.
	// Optional.
	OnEvent func(ctx context.Context, ev Event)

	// Logger receives warnings: store errors and lost leases. It never
	// sees a raw key, user or params.
	// Optional. Default: no logging.
	Logger *slog.Logger
}

// Result is what Runner.Do returns.
type Result struct {
	// Value is what fn returned, or, when Replayed, what the run that
	// finished the key returned.
	Value []byte
	// Replayed reports that fn did not run: the key was finished before
	// (or while Do waited, WaitInFlight) and Value is the stored result.
	Replayed bool
}

// ErrInProgress reports that another run holds the key and is still
// running (its lease is live). Do's error is then an *InProgressError,
// which carries how long to wait.
var ErrInProgress = errors.New("idemgate: the work under this idempotency key is still running")

// InProgressError is Do's error when another run holds the key.
type InProgressError struct {
	// RetryAfter is when to try again: the time left on the holder's
	// lease, but at most Lease/3 (the holder renews it while it runs,
	// and most work finishes long before its lease would run out).
	RetryAfter time.Duration
}

func (e *InProgressError) Error() string {
	return ErrInProgress.Error() + "; retry in " + e.RetryAfter.String()
}

// Unwrap returns ErrInProgress.
func (e *InProgressError) Unwrap() error { return ErrInProgress }

// KeyReusedError is Do's error when the key is held, running or finished,
// by a run of other params. (The kind and the scope's user are part of
// the key: another Kind or user is another key, and runs fn.)
type KeyReusedError struct {
	// Changed lists the JSON Pointers of Runner.Fingerprint.Fields whose
	// values differ, when the store could tell; names, never values.
	Changed []string
}

func (e *KeyReusedError) Error() string {
	if len(e.Changed) == 0 {
		return ErrKeyReused.Error()
	}
	return ErrKeyReused.Error() + " (changed: " + strings.Join(e.Changed, ", ") + ")"
}

// Unwrap returns ErrKeyReused.
func (e *KeyReusedError) Unwrap() error { return ErrKeyReused }

// doStatus is the status of the Response a Do record holds: fn's output is
// its body, with no headers. An operator's tool (idemgate records show)
// shows a Do record as a 200 response.
const doStatus = http.StatusOK

// Do runs fn once per key — keyspace.Derive(Kind, scope) — and stores what
// it returns:
//
//   - the first call claims the key and runs fn, renewing the lease every
//     Lease/3; fn's nil error completes the key with fn's output;
//   - a later call with the same params returns that output with
//     Replayed, and fn does not run;
//   - a call with other params gets an error matching ErrKeyReused (a
//     *KeyReusedError naming the fields that changed);
//   - a call while a run holds the key waits up to WaitInFlight, then
//     gets an error matching ErrInProgress (an *InProgressError);
//   - fn's error, its panic or its runtime.Goexit releases the key, so
//     that a redelivery runs fn again; Do returns fn's error as it is,
//     and a panic goes on.
//
// A nil fn is an error, before any claim.
//
// params are the work's parameters, a JSON document (or empty); with the
// zero Fingerprint, any other bytes are taken as they are. fn's context
// carries Do's values and cancellation, and RequestFromContext answers
// the key and fingerprint; it is canceled, with the cause ErrLeaseLost,
// when a renewal finds the claim lost (the lease ran out and another run
// may hold the key): fn should stop, as its result will not be stored.
// Without Atomic, the other run then runs fn too: both effects happen.
// With Atomic, it also carries the store's transaction
// (pgrecords.TxFromContext), which is fn's until fn returns: a goroutine
// of fn's must not use it after that.
//
// The store calls run without Do's cancellation (bounded by Lease), so
// that a claim the store made is not abandoned half-way; if ctx ends
// while Do claims or waits, a fresh claim is released and Do returns
// ctx's error.
//
// When fn returned nil but its result could not be stored, Do returns
// the output and an error: one wrapping ErrLeaseLost when the claim had
// been lost (another run may hold the key), another when the store
// failed (the key stays claimed until its lease runs out, then runs
// again). With Atomic, nothing of fn took effect then, unless the error
// says the commit's outcome is unknown, or fn ended the store's
// transaction itself (ErrTxAborted saying its writes "may have
// committed": they did, and the key is released); an error wrapping
// ErrTxConflict may commit on a retry, ErrTxRefused and ErrTxAborted
// will not.
func (r Runner) Do(ctx context.Context, scope keyspace.Scope, params []byte, fn func(ctx context.Context) ([]byte, error)) (Result, error) {
	m, err := r.engine()
	if err != nil {
		return Result{}, err
	}
	if fn == nil {
		// Before the claim: a nil fn would panic under it, released.
		return Result{}, errors.New("idemgate: do: fn is nil")
	}
	// The Engine lives for one call: its store deadline's timer ends
	// with it rather than a Lease later.
	defer func() {
		if e := m.epoch.Load(); e != nil {
			e.cancel()
		}
	}()
	st := &call{m: m, rt: &route{kind: r.Kind}, start: m.now()}
	st.ctx.parent = ctx
	st.req.Key, err = keyspace.Derive(r.Kind, scope)
	if err != nil {
		return Result{}, fmt.Errorf("idemgate: do: %w", err)
	}
	st.key = st.req.Key.String()
	fields := st.sums[:0]
	st.req.Fingerprint, fields, err = m.sumParams(params, fields)
	if err != nil {
		return Result{}, fmt.Errorf("idemgate: do: fingerprint params: %w", err)
	}

	st.token = newClaimToken(m.now(), m.cfg.Lease)
	claim := ClaimRequest{
		Fingerprint: st.req.Fingerprint,
		Owner:       st.req.Key.Owner(),
		Kind:        st.req.Key.Kind(),
		Lease:       m.cfg.Lease,
		Token:       st.token,
		Fields:      fields,
	}
	res, err := m.cfg.Store.Claim(st.storeCtx(), st.key, claim)
	if err == nil && res.Status == Running && m.cfg.WaitInFlight > 0 {
		res, err = st.wait(ctx, claim, res)
	}
	if cerr := ctx.Err(); cerr != nil {
		switch {
		case err != nil:
			st.releaseUnconfirmed()
		case res.Status == Claimed:
			st.release("canceled", 0)
		}
		return Result{}, fmt.Errorf("idemgate: do: %w", cerr)
	}
	if err != nil {
		st.emit(Event{Type: EventStoreError, Reason: "claim", Err: err})
		st.warn("idemgate: store unavailable", "claim", err)
		st.releaseUnconfirmed()
		return Result{}, fmt.Errorf("idemgate: do: claim: %w", err)
	}
	switch res.Status {
	case Claimed:
		st.emit(Event{Type: EventClaimed})
		if m.tx != nil {
			return st.doAtomic(ctx, fn)
		}
		return st.do(ctx, fn)
	case Finished:
		st.emit(Event{Type: EventReplayed, Status: res.Response.Status})
		return Result{Value: res.Response.Body, Replayed: true}, nil
	case Running:
		st.emit(Event{Type: EventInProgress})
		left := res.RetryAfter
		if left <= 0 {
			left = m.cfg.Lease
		}
		return Result{}, &InProgressError{RetryAfter: min(left, m.cfg.Lease/3)}
	case Mismatch:
		st.emit(Event{Type: EventReused})
		return Result{}, &KeyReusedError{Changed: m.changed(res.Changed, len(fields))}
	}
	err = errors.New("idemgate: do: store answered an unknown claim status " + res.Status.String())
	st.emit(Event{Type: EventStoreError, Reason: "claim", Err: err})
	st.releaseUnconfirmed()
	return Result{}, err
}

// engine returns the Engine of one Do call: Runner's fields validated and
// defaulted as NewEngine does for a route.
func (r Runner) engine() (*Engine, error) {
	if r.Kind == "" {
		// NewEngine would derive one from the route; there is none.
		return nil, errors.New("idemgate: Runner.Kind is required")
	}
	return newEngine(EngineConfig{
		Store:        r.Store,
		Kind:         r.Kind,
		Fingerprint:  r.Fingerprint,
		Lease:        r.Lease,
		Retention:    r.Retention,
		WaitInFlight: r.WaitInFlight,
		Atomic:       r.Atomic,
		OnEvent:      r.OnEvent,
		Logger:       r.Logger,
	}, time.Now)
}

// jsonParams and rawParams are the media types Do fingerprints params
// under: JSON, canonical (RFC 8785) and with Fingerprint's Fields and
// Exclude; or, with the zero Fingerprint, the exact bytes of params that
// are not JSON. A JSON document and other bytes never share a
// fingerprint, since the media type takes part.
var (
	jsonParams = &http.Request{Header: http.Header{"Content-Type": {"application/json"}}}
	rawParams  = &http.Request{Header: http.Header{"Content-Type": {"application/octet-stream"}}}
)

// sumParams returns the fingerprint of params and their field digests,
// appended to dst.
func (m *Engine) sumParams(params []byte, dst []fingerprint.FieldSum) (fingerprint.Fingerprint, []fingerprint.FieldSum, error) {
	fp, fields, err := m.fp.SumRequestFields(jsonParams, params, dst)
	if err == nil || !errors.Is(err, fingerprint.ErrInvalid) ||
		len(m.cfg.Fingerprint.Fields) > 0 || len(m.cfg.Fingerprint.Exclude) > 0 {
		return fp, fields, err
	}
	return m.fp.SumRequestFields(rawParams, params, dst)
}

// doContext returns fn's context: ctx with the call's Request
// (RequestFromContext), canceled with the cause ErrLeaseLost when a
// renewal finds the claim lost.
func (st *call) doContext(ctx context.Context) (context.Context, context.CancelCauseFunc) {
	st.rctx = requestContext{Context: ctx, st: st}
	fctx, cancel := context.WithCancelCause(&st.rctx)
	st.lost = cancel
	return fctx, cancel
}

// do runs fn under the claim, then completes or releases it.
func (st *call) do(ctx context.Context, fn func(ctx context.Context) ([]byte, error)) (Result, error) {
	fctx, cancel := st.doContext(ctx)
	defer cancel(nil)
	st.startRenewal()
	finished := false
	defer func() {
		if finished {
			return
		}
		// fn panicked (or called runtime.Goexit): release the claim so a
		// redelivery runs, then panic on.
		st.stopRenewal()
		st.release("panic", 0)
		if p := recover(); p != nil {
			panic(p)
		}
	}()
	out, err := fn(fctx)
	finished = true
	st.stopRenewal()
	if err != nil {
		st.release("handler_error", 0)
		if errors.Is(err, ErrKeyReused) {
			st.emit(Event{Type: EventReused})
		}
		return Result{}, err
	}
	resp := Response{Status: doStatus, Body: out}
	if err := st.m.cfg.Store.Complete(st.storeCtx(), st.key, st.token, resp, st.m.cfg.Retention); err != nil {
		st.storeFailed(&st.ctx, "complete", err)
		return Result{Value: out}, fmt.Errorf("idemgate: do: complete: %w", err)
	}
	return Result{Value: out}, nil
}

// doAtomic runs fn under the claim inside a transaction of the store's,
// and commits fn's writes with the record's completion, fenced by the
// claim's token; anything else rolls back and releases the claim.
func (st *call) doAtomic(ctx context.Context, fn func(ctx context.Context) ([]byte, error)) (Result, error) {
	m := st.m
	tx, err := m.tx.Begin(txlease.With(st.storeCtx(), m.cfg.Lease))
	if err != nil {
		st.emit(Event{Type: EventStoreError, Reason: "begin", Err: err})
		st.warn("idemgate: store unavailable", "begin", err)
		st.release("begin_failed", 0)
		return Result{}, fmt.Errorf("idemgate: do: begin: %w", err)
	}
	fctx, cancel := st.doContext(ctx)
	defer cancel(nil)
	fctx = tx.Context(fctx)
	st.startRenewal()
	finished := false
	defer func() {
		if finished {
			return
		}
		// fn panicked: roll back, release, and panic on.
		st.stopRenewal()
		st.rollback(tx)
		st.release("panic", 0)
		if p := recover(); p != nil {
			panic(p)
		}
	}()
	out, err := fn(fctx)
	finished = true
	st.stopRenewal()
	if err != nil {
		if aborted := st.rollback(tx); aborted != nil {
			st.release("tx_aborted", 0)
			return Result{}, errors.Join(err, fmt.Errorf("idemgate: do: rollback: %w", aborted))
		}
		st.release("handler_error", 0)
		if errors.Is(err, ErrKeyReused) {
			st.emit(Event{Type: EventReused})
		}
		return Result{}, err
	}
	done := &Completion{Key: st.key, Token: st.token, Retention: m.cfg.Retention,
		Response: Response{Status: doStatus, Body: out}}
	err = tx.Commit(st.storeCtx(), done)
	switch {
	case err == nil:
		return Result{Value: out}, nil
	case errors.Is(err, ErrTxAborted):
		st.rollback(tx)
		st.warn("idemgate: fn broke its transaction", "commit", err)
		st.release("tx_aborted", 0)
	case errors.Is(err, ErrTxRefused):
		st.release("commit_refused", 0)
	case errors.Is(err, ErrTxConflict):
		st.warn("idemgate: the transaction conflicted at its commit", "commit", err)
		st.release("commit_conflict", 0)
	case errors.Is(err, ErrLeaseLost):
		st.storeFailed(&st.ctx, "commit", err)
	default:
		st.rollback(tx)
		st.emit(Event{Type: EventStoreError, Reason: "commit", Err: err})
		st.warn("idemgate: commit failed", "commit", err)
		// If the commit did happen, the record is finished and the
		// release (fenced) changes nothing.
		st.releaseUnconfirmed()
	}
	return Result{Value: out}, fmt.Errorf("idemgate: do: commit: %w", err)
}
