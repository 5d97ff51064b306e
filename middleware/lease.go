package middleware

import (
	"context"
	"time"
)

// storeCtx returns the context of a store call made for the request
// (claim, complete, release): the request's values without its
// cancellation, bounded by one Lease. A disconnected client must not cut a
// store call short — a claim or completion the store already executed
// would be stranded, and the claim would block the client's retry for a
// lease — but a dead store must not hold the request forever. Calls share
// one context while at least half of its time is left: a timer per call
// costs allocations on every request.
func (st *call) storeCtx() context.Context {
	if st.sctx != nil {
		if d, _ := st.sctx.Deadline(); time.Until(d) >= st.m.cfg.Lease/2 {
			return st.sctx
		}
		st.scancel()
	}
	st.sctx, st.scancel = context.WithTimeout(&st.ctx, st.m.cfg.Lease)
	return st.sctx
}

// cancelStore frees the store context's timer.
func (st *call) cancelStore() {
	if st.scancel != nil {
		st.scancel()
	}
}

// detached is what context.WithoutCancel returns, kept inside call to save
// an allocation per request: the parent's values, never its cancellation.
type detached struct{ parent context.Context }

func (detached) Deadline() (time.Time, bool) { return time.Time{}, false }

func (detached) Done() <-chan struct{} { return nil }

func (detached) Err() error { return nil }

func (d *detached) Value(key any) any { return d.parent.Value(key) }

// lostClaimTimeout bounds the release of a claim whose answer was lost.
const lostClaimTimeout = time.Second

// releaseUnconfirmed gives back the claim that a failed Claim call may have
// made: the store can have run it and lost only its answer (a read timeout
// after Redis ran the script), and that claim would block the client's
// retry for a whole lease with nothing running. The release is fenced by
// this request's own token, so it deletes this claim and nothing else. Best
// effort, on a short detached context: the store just failed.
func (st *call) releaseUnconfirmed() {
	ctx, cancel := context.WithTimeout(&st.ctx, min(st.m.cfg.Lease, lostClaimTimeout))
	defer cancel()
	if st.m.cfg.Store.Release(ctx, st.key, st.token) == nil {
		st.emit(Event{Type: EventReleased, Reason: "claim_failed"})
	}
}

// startRenewal extends the lease every Lease/3 while the handler runs.
func (st *call) startRenewal() {
	every := st.m.cfg.Lease / 3
	st.renewMu.Lock()
	defer st.renewMu.Unlock()
	st.renewer = time.AfterFunc(every, func() {
		st.renewMu.Lock()
		defer st.renewMu.Unlock()
		if st.renewDone {
			return
		}
		ctx, cancel := context.WithTimeout(&st.ctx, every)
		err := st.m.cfg.Store.Extend(ctx, st.key, st.token, st.m.cfg.Lease)
		cancel()
		if err != nil {
			st.storeFailed("extend", err)
		}
		st.renewer.Reset(every)
	})
}

// stopRenewal stops the renewals and waits for one in progress.
func (st *call) stopRenewal() {
	st.renewMu.Lock()
	st.renewDone = true
	st.renewer.Stop()
	st.renewMu.Unlock()
}
