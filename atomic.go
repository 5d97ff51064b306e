package idemgate

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/idemgate/idemgate/internal/txlease"
)

// passThrough runs a request the engine does not protect (no key, or
// a method it does not protect): as it is, or on an Atomic route in a
// transaction of its own under the same commit and rollback rule, which
// finishes no record.
func (m *Engine) passThrough(w http.ResponseWriter, r *http.Request, d Door, x, next any) error {
	if m.tx == nil {
		return d.Next(w, r, x, next)
	}
	rt, _ := m.route(r, d, x)
	if rt == nil {
		return d.Next(w, r, x, next) // the router's 404 or 405: no transaction for it
	}
	st := &call{m: m, rt: rt, d: d, x: x, next: next, start: m.now()}
	st.ctx.parent = r.Context()
	return st.runAtomic(w, r)
}

// runAtomic runs the handler inside a transaction of the store's and holds
// its whole answer back. A response that would be stored commits (with
// the record's completion, fenced by the claim's token, when the request
// holds a claim) and then goes out; anything else rolls back, releases the
// claim and answers what is left to say.
func (st *call) runAtomic(w http.ResponseWriter, r *http.Request) (err error) {
	m, d, x := st.m, st.d, st.x
	claimed := st.key != ""
	tx, err := m.tx.Begin(txlease.With(st.storeCtx(), m.cfg.Lease))
	if err != nil {
		st.emit(Event{Type: EventStoreError, Reason: "begin", Err: err})
		st.warn("idemgate: store unavailable", "begin", err)
		if claimed {
			st.release("begin_failed", 0)
		}
		return m.problem(w, r, d, x, http.StatusServiceUnavailable, CodeStoreUnavailable,
			"The idempotency store is unavailable; retry later.", 1)
	}
	if claimed {
		r = st.withRequest(r)
	}
	r = r.WithContext(tx.Context(r.Context()))
	front, inner := st.capture(w)
	st.cw.hold = true
	if claimed {
		st.startRenewal()
	}

	finished := false
	defer func() {
		if finished {
			return
		}
		// The handler panicked: roll back, release, and panic on.
		if claimed {
			st.stopRenewal()
		}
		d.Swap(x, inner)
		st.rollback(tx)
		st.takeBack()
		st.cw.release()
		if claimed {
			st.release("panic", 0)
		}
		if p := recover(); p != nil {
			panic(p)
		}
	}()
	err = d.Next(front, r, x, st.next)
	if err == nil && !st.cw.wroteHeader {
		front.WriteHeader(http.StatusOK)
		if !st.cw.wroteHeader {
			// The framework marked its response committed at a 1xx
			// (echo, at a 103 Early Hints) and dropped every
			// WriteHeader since: the 200 that net/http sends on a
			// plain route is the answer here too.
			st.cw.WriteHeader(http.StatusOK)
		}
	}
	finished = true
	if claimed {
		st.stopRenewal()
	}
	d.Swap(x, inner)
	defer st.cw.release()

	switch {
	case err != nil:
		if aborted := st.rollback(tx); aborted != nil {
			return st.txAborted(w, r, claimed, aborted)
		}
		st.takeBack()
		if !claimed {
			return err
		}
		st.release("handler_error", 0)
		if errors.Is(err, ErrKeyReused) {
			st.emit(Event{Type: EventReused, Status: m.cfg.MismatchStatus})
			return m.reused(w, r, d, x, nil)
		}
		return err
	case !m.cfg.Cacheable(st.cw.status):
		if aborted := st.rollback(tx); aborted != nil {
			return st.txAborted(w, r, claimed, aborted)
		}
		if claimed {
			st.release("not_cacheable", st.cw.status)
		}
		if !st.cw.overflow {
			st.send()
			return nil
		}
		// The body was too large to hold and is gone; the status the
		// handler chose (a 429, a 503) and its Retry-After still say
		// what the client should do.
		retry := handlerRetry(st.cw.status, st.cw.sent.Get("Retry-After"), m.now())
		st.takeBack()
		return m.problem(w, r, d, x, st.cw.status, CodeResponseTooLarge,
			"The answer was larger than this endpoint can hold, so its transaction was rolled back.", retry)
	case st.cw.overflow:
		if aborted := st.rollback(tx); aborted != nil {
			return st.txAborted(w, r, claimed, aborted)
		}
		st.takeBack()
		if claimed {
			st.release("response_too_large", st.cw.status)
		}
		return m.problem(w, r, d, x, http.StatusInternalServerError, CodeResponseTooLarge,
			"The answer was larger than this endpoint can store, so its transaction was rolled back.", 0)
	}

	var done *Completion
	if claimed && plant != "complete-outside-tx" {
		done = &Completion{Key: st.key, Token: st.token, Retention: m.cfg.Retention,
			Response: Response{Status: st.cw.status, Header: st.cw.header, Body: *st.cw.body}}
	}
	err = tx.Commit(st.storeCtx(), done)
	switch {
	case errors.Is(err, ErrTxAborted):
		st.rollback(tx)
		return st.txAborted(w, r, claimed, err)
	case errors.Is(err, ErrTxRefused):
		// The database refused what the handler wrote (a deferred
		// constraint): the handler's failure, answered as its error
		// (the application's error handler may map the database's
		// error), with the hint that a retry would meet it again.
		st.takeBack()
		if claimed {
			st.release("commit_refused", st.cw.status)
		}
		w.Header().Set(shouldRetryHeader, "false")
		return err
	case errors.Is(err, ErrTxConflict):
		// Rolled back for a concurrent transaction's sake: a retry may
		// commit.
		st.warn("idemgate: the transaction conflicted at its commit", "commit", err)
		st.takeBack()
		if claimed {
			st.release("commit_conflict", st.cw.status)
		}
		return m.problem(w, r, d, x, http.StatusServiceUnavailable, CodeTxConflict,
			"This request's transaction conflicted with a concurrent one and was rolled back; nothing of it took effect. Retry with the same key.", 1)
	case errors.Is(err, ErrLeaseLost):
		st.storeFailed(&st.ctx, "commit", err)
		st.takeBack()
		return m.problem(w, r, d, x, http.StatusServiceUnavailable, CodeLeaseLost,
			"This request's claim on its idempotency key ran out before it could commit (another request may have taken the key over); nothing of this request took effect. Retry with the same key.", 1)
	case err != nil:
		st.rollback(tx)
		st.emit(Event{Type: EventStoreError, Reason: "commit", Err: err})
		st.warn("idemgate: commit failed", "commit", err)
		if claimed {
			// If the commit did happen, the record is finished and the
			// release (fenced) changes nothing.
			st.releaseUnconfirmed()
		}
		st.takeBack()
		return m.problem(w, r, d, x, http.StatusServiceUnavailable, CodeStoreUnavailable,
			"The transaction of this request could not be committed; retry later.", 1)
	}
	if claimed && plant == "complete-outside-tx" {
		st.complete() // planted: the completion written after the handler's transaction committed
	}
	st.send()
	return nil
}

// rollback rolls tx back; a failure is reported, and the transaction ends
// with its connection anyway. It returns the error when the handler had
// ended the transaction itself (ErrTxAborted): a fault of the handler's,
// not the store's.
func (st *call) rollback(tx Tx) (aborted error) {
	err := tx.Rollback(st.storeCtx())
	switch {
	case errors.Is(err, ErrTxAborted):
		return err
	case err != nil:
		st.emit(Event{Type: EventStoreError, Reason: "rollback", Err: err})
		st.warn("idemgate: rollback failed", "rollback", err)
	}
	return nil
}

// txAborted answers a request whose handler broke its transaction
// (ErrTxAborted): nothing is stored, the claim is released so that a
// resent request runs, and the client gets 500 transaction_aborted, not
// to be retried automatically: each retry would run the handler again,
// which would most likely break it again. The held answer is dropped.
func (st *call) txAborted(w http.ResponseWriter, r *http.Request, claimed bool, err error) error {
	st.warn("idemgate: the handler broke its transaction", "commit", err)
	st.takeBack()
	if claimed {
		st.release("tx_aborted", st.cw.status)
	}
	return st.m.problem(w, r, st.d, st.x, http.StatusInternalServerError, CodeTxAborted,
		"This request's handler broke its database transaction, so nothing of it was stored.", 0)
}

// handlerRetry is the Retry-After, in seconds, of an answer that keeps
// the handler's status, whose own Retry-After was header: 0 (no retry)
// unless the handler sent one or its status is one that clients retry
// (408, 429, 502, 503, 504). A Retry-After in delta-seconds is kept, an
// HTTP-date counts from now; either is at least 1.
func handlerRetry(status int, header string, now time.Time) int {
	if header != "" {
		if secs, err := strconv.Atoi(header); err == nil {
			return max(secs, 1)
		}
		if at, err := http.ParseTime(header); err == nil {
			return retrySeconds(at.Sub(now))
		}
		return 1
	}
	switch status {
	case http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return 1
	}
	return 0
}
