package storetest

import (
	"testing"
	"time"

	"github.com/idemgate/idemgate"
)

// RunDurability checks that records outlive a restart of the server under
// the store. It takes one harness from newHarness, writes records through
// its Store (finished ones on plain and keyspace keys, a running claim, a
// claim whose lease runs out, a released claim, a finished record with a
// short retention), calls Restart once, and then checks through Store and
// Other that:
//
//   - every finished record replays byte for byte, and a mismatch still
//     carries nothing;
//   - the running claim is still running and fenced: only its token
//     extends and completes it;
//   - the released key is still free;
//   - leases and retentions keep counting: past them, the keys are free,
//     and the stale holder cannot complete.
//
// Restart breaks every connection to the server, so the harness must be
// on a server that serves nothing else while RunDurability runs; it does
// not call t.Parallel. If the harness has no Restart, RunDurability skips.
func RunDurability(t *testing.T, newHarness func(t *testing.T) Harness) {
	h := newHarness(t)
	if h.Restart == nil {
		t.Skip("storetest: Harness.Restart is nil: records surviving a server restart are not tested")
	}
	type finished struct {
		key  string
		req  idemgate.ClaimRequest
		resp idemgate.Response
	}
	var done []finished
	for _, kk := range keyKinds {
		for _, resp := range responses() {
			key, req := newCase(t, kk.keys)
			claim(t, h.Store, key, req, idemgate.Claimed)
			if err := h.Store.Complete(ctx(t), key, req.Token, resp, time.Hour); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			done = append(done, finished{key, req, resp})
		}
	}
	k := keyKinds[1].keys
	running, runReq := newCase(t, k)
	claim(t, h.Store, running, runReq, idemgate.Claimed)
	expiring, expReq := newCase(t, k)
	expReq.Lease = h.Lease
	claim(t, h.Store, expiring, expReq, idemgate.Claimed)
	released, relReq := newCase(t, k)
	claim(t, h.Store, released, relReq, idemgate.Claimed)
	if err := h.Store.Release(ctx(t), released, relReq.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	retained, retReq := newCase(t, k)
	claim(t, h.Store, retained, retReq, idemgate.Claimed)
	retention := 2 * h.Lease
	if err := h.Store.Complete(ctx(t), retained, retReq.Token, sampleResponse(), retention); err != nil {
		t.Fatalf("Complete: %v", err)
	}

	h.Restart(t)
	if t.Failed() {
		t.FailNow()
	}

	t.Run("FinishedReplays", func(t *testing.T) {
		for _, d := range done {
			for _, s := range []idemgate.Store{h.Store, h.second()} {
				checkReplay(t, claim(t, s, d.key, retry(d.req), idemgate.Finished).Response, d.resp)
			}
		}
	})
	t.Run("MismatchCarriesNothing", func(t *testing.T) {
		d := done[0]
		for _, m := range mismatches(d.req) {
			checkNothing(t, claim(t, h.second(), d.key, m, idemgate.Mismatch))
		}
	})
	t.Run("RunningKeepsFencing", func(t *testing.T) {
		res := claim(t, h.second(), running, retry(runReq), idemgate.Running)
		if res.RetryAfter <= 0 || res.RetryAfter > longLease {
			t.Errorf("RetryAfter = %v, want in (0, %v]", res.RetryAfter, longLease)
		}
		wrong := token()
		checkLost(t, "Extend with a wrong token", h.second().Extend(ctx(t), running, wrong, h.Lease))
		checkLost(t, "Complete with a wrong token", h.second().Complete(ctx(t), running, wrong, idemgate.Response{Status: 418}, time.Hour))
		checkLost(t, "Release with a wrong token", h.second().Release(ctx(t), running, wrong))
		if err := h.Store.Extend(ctx(t), running, runReq.Token, longLease); err != nil {
			t.Errorf("the holder's Extend: %v", err)
		}
		want := sampleResponse()
		if err := h.second().Complete(ctx(t), running, runReq.Token, want, time.Hour); err != nil {
			t.Fatalf("the holder's Complete: %v", err)
		}
		checkReplay(t, claim(t, h.Store, running, retry(runReq), idemgate.Finished).Response, want)
	})
	t.Run("ReleasedStaysFree", func(t *testing.T) {
		claim(t, h.second(), released, retry(relReq), idemgate.Claimed)
	})

	h.Advance(retention + h.Lease)
	t.Run("LeaseRunsOut", func(t *testing.T) {
		fresh := retry(expReq)
		fresh.Lease = longLease
		claim(t, h.second(), expiring, fresh, idemgate.Claimed)
		checkLost(t, "stale Complete", h.Store.Complete(ctx(t), expiring, expReq.Token, idemgate.Response{Status: 418}, time.Hour))
		claim(t, h.Store, expiring, retry(expReq), idemgate.Running)
	})
	t.Run("RetentionRunsOut", func(t *testing.T) {
		claim(t, h.second(), retained, retry(retReq), idemgate.Claimed)
	})
}
