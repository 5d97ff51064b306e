package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/idemgate/idemgate"
)

// txCases are the cases of a store that implements idemgate.TxStore
// (Atomic routes); Run skips them for any other store.
var txCases = []struct {
	name string
	run  func(t *testing.T, h Harness, s idemgate.TxStore, k keys)
}{
	{"TxCommitFinishes", testTxCommitFinishes},
	{"TxRollbackKeepsClaim", testTxRollbackKeepsClaim},
	{"TxCommitWithoutRecord", testTxCommitWithoutRecord},
	{"TxCommitFencedByToken", testTxCommitFencedByToken},
	{"TxCommitAfterLeaseRanOut", testTxCommitAfterLeaseRanOut},
}

func begin(t *testing.T, s idemgate.TxStore) idemgate.Tx {
	t.Helper()
	tx, err := s.Begin(ctx(t))
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx(t)) })
	return tx
}

func completion(key string, req idemgate.ClaimRequest, resp idemgate.Response) *idemgate.Completion {
	return &idemgate.Completion{Key: key, Token: req.Token, Response: resp, Retention: time.Hour}
}

// testTxCommitFinishes: a commit with a completion finishes the record,
// which every client then replays byte for byte; the claim's token can no
// longer change it.
func testTxCommitFinishes(t *testing.T, h Harness, s idemgate.TxStore, k keys) {
	for name, resp := range responses() {
		t.Run(name, func(t *testing.T) {
			key, req := newCase(t, k)
			claim(t, h.Store, key, req, idemgate.Claimed)
			tx := begin(t, s)
			if tx.Context(ctx(t)) == nil {
				t.Fatal("Tx.Context returned nil")
			}
			if err := tx.Commit(ctx(t), completion(key, req, resp)); err != nil {
				t.Fatalf("Commit: %v", err)
			}
			checkReplay(t, claim(t, h.second(), key, retry(req), idemgate.Finished).Response, resp)
			checkLost(t, "Release after the commit", h.Store.Release(ctx(t), key, req.Token))
			checkLost(t, "Extend after the commit", h.Store.Extend(ctx(t), key, req.Token, longLease))
		})
	}
}

// testTxRollbackKeepsClaim: a rollback leaves the claim as it was: still
// the token's to release, so that a retry runs.
func testTxRollbackKeepsClaim(t *testing.T, h Harness, s idemgate.TxStore, k keys) {
	key, req := newCase(t, k)
	claim(t, h.Store, key, req, idemgate.Claimed)
	tx := begin(t, s)
	if err := tx.Rollback(ctx(t)); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
	claim(t, h.second(), key, retry(req), idemgate.Running)
	if err := h.Store.Release(ctx(t), key, req.Token); err != nil {
		t.Fatalf("Release after the rollback: %v", err)
	}
	claim(t, h.second(), key, retry(req), idemgate.Claimed)
}

// testTxCommitWithoutRecord: a transaction of a request without a key
// commits without a completion.
func testTxCommitWithoutRecord(t *testing.T, _ Harness, s idemgate.TxStore, _ keys) {
	if err := begin(t, s).Commit(ctx(t), nil); err != nil {
		t.Fatalf("Commit without a completion: %v", err)
	}
}

// testTxCommitFencedByToken: a completion whose token does not hold the
// claim (another token's, released, already finished) is ErrLeaseLost,
// and the record stays as it was.
func testTxCommitFencedByToken(t *testing.T, h Harness, s idemgate.TxStore, k keys) {
	key, req := newCase(t, k)
	claim(t, h.Store, key, req, idemgate.Claimed)
	wrong := retry(req)
	checkLost(t, "Commit with another token", begin(t, s).Commit(ctx(t), completion(key, wrong, sampleResponse())))
	claim(t, h.second(), key, retry(req), idemgate.Running)

	released, relReq := newCase(t, k)
	claim(t, h.Store, released, relReq, idemgate.Claimed)
	if err := h.Store.Release(ctx(t), released, relReq.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	checkLost(t, "Commit after Release", begin(t, s).Commit(ctx(t), completion(released, relReq, sampleResponse())))
	claim(t, h.second(), released, retry(relReq), idemgate.Claimed)

	if err := h.Store.Complete(ctx(t), key, req.Token, sampleResponse(), time.Hour); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	other := sampleResponse()
	other.Body = []byte("another answer")
	checkLost(t, "Commit of a finished record", begin(t, s).Commit(ctx(t), completion(key, req, other)))
	checkReplay(t, claim(t, h.second(), key, retry(req), idemgate.Finished).Response, sampleResponse())
}

// testTxCommitAfterLeaseRanOut: a claim whose lease ran out cannot commit,
// whether or not another request has taken the key since; the taker's
// claim is untouched. The store decides by its clock at the commit, not
// at the transaction's start: the transaction begins while the lease
// still holds.
//
// Only the stale claim's lease is the case's subject: the taker claims
// for longLease, as in testLeaseExpiry, since the case checks after the
// commit that it still holds the key. With the stale claim's Harness.Lease
// (600 ms on Postgres) a loaded machine let it run out between its claim
// and that check ("Claim = claimed, want running", in pgx's describe exec
// mode beside pgstore's tests).
func testTxCommitAfterLeaseRanOut(t *testing.T, h Harness, s idemgate.TxStore, k keys) {
	for _, taken := range []bool{false, true} {
		key, stale := newCase(t, k)
		stale.Lease = h.Lease
		claim(t, h.Store, key, stale, idemgate.Claimed)
		tx := begin(t, s)
		h.Advance(h.Lease + h.Lease/2)
		fresh := retry(stale)
		fresh.Lease = longLease
		if taken {
			claim(t, h.second(), key, fresh, idemgate.Claimed)
		}
		err := tx.Commit(ctx(t), completion(key, stale, sampleResponse()))
		if !errors.Is(err, idemgate.ErrLeaseLost) {
			t.Fatalf("Commit after the lease ran out (taken over: %v) = %v, want ErrLeaseLost", taken, err)
		}
		if taken {
			claim(t, h.Store, key, retry(stale), idemgate.Running)
			if err := h.second().Complete(ctx(t), key, fresh.Token, sampleResponse(), time.Hour); err != nil {
				t.Fatalf("the taker's Complete: %v", err)
			}
		} else {
			claim(t, h.second(), key, fresh, idemgate.Claimed)
		}
	}
}
