package idemgate

import (
	"context"
	"errors"
	"math"
	"runtime"
	"testing"
	"time"
)

type ctxKey struct{}

// TestStoreContext: a store call's context carries the request's values
// but not its cancellation, ends at a deadline between 7/8 of a Lease and
// a Lease from the call, and contexts derived from it are canceled with it
// (no goroutine each) and see its cause.
func TestStoreContext(t *testing.T) {
	lease := 200 * time.Millisecond
	m := &Engine{cfg: EngineConfig{Lease: lease}}
	req, cancelReq := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	st := &call{m: m}
	st.ctx.parent = req
	start := time.Now()
	ctx := st.storeCtx()
	cancelReq()
	if ctx.Value(ctxKey{}) != "v" {
		t.Fatal("the request's value is lost")
	}
	if ctx.Err() != nil {
		t.Fatal("the request's cancellation reached the store context")
	}
	d, ok := ctx.Deadline()
	if !ok || d.Before(start.Add(lease-lease/epochSlack)) || d.After(time.Now().Add(lease)) {
		t.Fatalf("deadline %v after the call, want between 7/8 of %v and %v", d.Sub(start), lease, lease)
	}
	if st.storeCtx() != ctx {
		t.Fatal("a second call within half a lease got another context")
	}
	if done := ctx.Done(); done == nil || ctx.Done() != done {
		t.Fatal("Done is nil or changes")
	}

	goroutines := runtime.NumGoroutine()
	child, cancelChild := context.WithTimeout(ctx, time.Hour)
	defer cancelChild()
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { close(fired) })
	defer stop()
	if n := runtime.NumGoroutine(); n > goroutines {
		t.Errorf("deriving contexts started %d goroutines", n-goroutines)
	}
	select {
	case <-child.Done():
	case <-time.After(time.Minute): // patience: the derived context's own timeout is an hour
		t.Fatal("a derived context outlived the store context's deadline")
	}
	<-fired
	<-ctx.Done()
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) || !errors.Is(child.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err %v, derived %v; want DeadlineExceeded", ctx.Err(), child.Err())
	}
	if !errors.Is(context.Cause(ctx), context.DeadlineExceeded) || !errors.Is(context.Cause(child), context.DeadlineExceeded) {
		t.Fatalf("Cause %v, derived %v; want DeadlineExceeded", context.Cause(ctx), context.Cause(child))
	}

	// Later calls get a fresh deadline; the one a store may still hold
	// keeps its own.
	next := st.storeCtx()
	if next == ctx || next.Err() != nil {
		t.Fatalf("after the deadline storeCtx gave %v (err %v)", next, next.Err())
	}
	if ctx.Err() == nil {
		t.Fatal("the first context came back to life")
	}
	// Another request shares the epoch.
	other := &call{m: m}
	other.ctx.parent = context.Background()
	d1, _ := next.Deadline()
	d2, _ := other.storeCtx().Deadline()
	if !d1.Equal(d2) {
		t.Errorf("deadlines %v and %v: the epoch is not shared", d1, d2)
	}
}

// TestStoreContextHugeLease: a Lease up to math.MaxInt64 neither
// overflows the epoch's deadline into the past nor makes a new epoch per
// call; the context stays live and shared.
func TestStoreContextHugeLease(t *testing.T) {
	for _, lease := range []time.Duration{math.MaxInt64, 200 * 365 * 24 * time.Hour} {
		m := &Engine{cfg: EngineConfig{Lease: lease}}
		st := &call{m: m}
		st.ctx.parent = context.Background()
		ctx := st.storeCtx()
		d, ok := ctx.Deadline()
		if !ok || ctx.Err() != nil || time.Until(d) < lease-lease/epochSlack {
			t.Fatalf("lease %v: deadline in %v (ok %v), err %v", lease, time.Until(d), ok, ctx.Err())
		}
		if st.storeCtx() != ctx || m.storeEpoch() != m.storeEpoch() {
			t.Errorf("lease %v: the context or the epoch is not reused", lease)
		}
	}
}
