package idemgate

import (
	"context"
	"errors"
	"time"
)

// storeCtx returns the context of a store call made for the request
// (claim, complete, release): the request's values without its
// cancellation, bounded by one Lease. A disconnected client must not cut a
// store call short — a claim or completion the store already executed
// would be stranded, and the claim would block the client's retry for a
// lease — but a dead store must not hold the request forever. Calls share
// one context while at least half of its time is left; its deadline and
// cancellation are a storeEpoch's, shared with the other requests, so that
// a request costs no timer of its own.
func (st *call) storeCtx() context.Context {
	if st.sctx != nil {
		if d, _ := st.sctx.Deadline(); time.Until(d) >= st.m.cfg.Lease/2 {
			return st.sctx
		}
		// A handler ran for more than half a lease: a context of its
		// own, since a store may still hold the first one.
		st.sctx = &storeContext{values: &st.ctx, epoch: st.m.storeEpoch()}
		return st.sctx
	}
	st.sc = storeContext{values: &st.ctx, epoch: st.m.storeEpoch()}
	st.sctx = &st.sc
	return st.sctx
}

// epochSlack is the part of a Lease by which a storeEpoch may have run
// down when a store call starts: every store call gets between 7/8 of a
// Lease and a Lease, the first call of a request included.
const epochSlack = 8

// storeEpoch returns a context that ends a Lease after it was made, at
// least Lease - Lease/epochSlack from now. One is made every
// Lease/epochSlack at most, and its timer is freed when it fires.
func (m *Engine) storeEpoch() context.Context {
	now := time.Now()
	if e := m.epoch.Load(); e != nil && e.deadline.Sub(now) >= m.cfg.Lease-m.cfg.Lease/epochSlack {
		return e.ctx
	}
	e := &epoch{deadline: now.Add(m.cfg.Lease)}
	e.ctx, e.cancel = context.WithDeadline(context.Background(), e.deadline)
	m.epoch.Store(e) // a concurrent request's epoch is as good
	return e.ctx
}

// epoch is a deadline shared by the store calls of the requests that start
// while most of it is left.
type epoch struct {
	deadline time.Time
	ctx      context.Context
	cancel   context.CancelFunc // never called: the deadline frees the timer
}

// storeContext is a store call's context: the request's values, an
// epoch's deadline and cancellation. It lives inside call, so a request
// allocates no context and starts no timer.
type storeContext struct {
	values *detached
	epoch  context.Context
}

func (c *storeContext) Deadline() (time.Time, bool) { return c.epoch.Deadline() }

func (c *storeContext) Done() <-chan struct{} { return c.epoch.Done() }

func (c *storeContext) Err() error { return c.epoch.Err() }

// Value answers the epoch's own key first: the epoch (a context.WithDeadline
// of Background) holds no value but the context package's own, which names
// its cancellation. Contexts derived from this one (a store's
// context.WithTimeout, context.AfterFunc) so join the epoch's cancellation
// directly, without a goroutine each, and context.Cause is the epoch's.
func (c *storeContext) Value(key any) any {
	if v := c.epoch.Value(key); v != nil {
		return v
	}
	return c.values.Value(key)
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

// retrySooner is how many times sooner than Lease/3 a renewal that failed
// at the end of its time is tried again.
const retrySooner = 4

// startRenewal extends the lease every Lease/3 while the handler runs. A
// renewal that fails for any reason but a lost lease is tried again Lease/3
// after it began, and at least Lease/12 after it ended: a renewal may take
// up to Lease/3, so one that stalled to its end leaves a third of the
// lease, and a next try Lease/3 after it ended would come just as the
// lease ran out. A renewal that failed fast (a refused connection) is
// tried again no more often than before.
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
		next, began := every, time.Now()
		ctx, cancel := context.WithTimeout(&st.ctx, every)
		if err := st.m.cfg.Store.Extend(ctx, st.key, st.token, st.m.cfg.Lease); err != nil {
			st.storeFailed(ctx, "extend", err)
			if !errors.Is(err, ErrLeaseLost) {
				next = max(every-time.Since(began), every/retrySooner)
			}
		}
		cancel()
		st.renewer.Reset(next)
	})
}

// stopRenewal stops the renewals and waits for one in progress.
func (st *call) stopRenewal() {
	st.renewMu.Lock()
	st.renewDone = true
	st.renewer.Stop()
	st.renewMu.Unlock()
}
