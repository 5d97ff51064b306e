// Package storetest is the conformance suite for idemgate.Store: every
// store idemgate ships (Redis on miniredis, a redis-server and a Redis
// Cluster; PostgreSQL in package pgrecords) runs it, and so should a store
// you write yourself (DynamoDB, Spanner, …).
//
// Run calls your harness once per case and runs each case twice: on plain
// keys (any string) and on keys derived by package keyspace, whose owner
// and kind a store may take from the key. The cases cover claiming and
// its answers (Running with the lease left, Finished with the response
// byte for byte, Mismatch carrying nothing), fencing by token after a
// lease runs out, extend, release, complete after release, retention, a
// resent claim and a resent complete, a release after a claim whose answer
// was lost, concurrent claims of one key (one winner), cancelled contexts,
// and the changed fields of a Mismatch (for a store that keeps them). A
// store that implements idemgate.TxStore (Atomic routes) also runs the
// Tx cases: a commit finishes the record, a rollback keeps the claim, and
// a completion is fenced by its token and by the lease at commit time.
//
// Two clients: a store is shared by many processes, each with its own
// connections. A harness with Other (a second, independent client of the
// same backend: another connection pool, another cluster client) sends the
// second request of each case through it, and ConcurrentClaimsTwoClients
// splits its goroutines over both; without Other that case is skipped.
//
// Durability: RunDurability writes records, calls the harness's Restart,
// and checks that they replay byte for byte and that a claim in flight
// keeps fencing. A restart breaks every connection to the server, so
// RunDurability is separate from Run: give it a server of its own, and
// have Restart crash it (SIGKILL) rather than shut it down, since a clean
// shutdown saves what a crash loses (a PostgreSQL UNLOGGED table, Redis
// writes not yet fsynced). Without Restart (a server without persistence)
// RunDurability skips, saying so.
//
// A store on a real server uses real time: Advance sleeps, and Lease is
// long enough for the server to answer a few calls within it. A store with a fake
// clock advances the clock instead. Run's cases run in parallel and use
// random keys, so one store (one database) may serve every case.
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/keyspace"
)

// Harness is one store under test.
type Harness struct {
	// Store is the store under test. Required.
	Store idemgate.Store
	// Other is a second, independent client of Store's backend: a store
	// on another connection pool or another Redis client, as a second
	// node of a service would have. Optional: without it, the cases use
	// Store alone and ConcurrentClaimsTwoClients is skipped.
	Other idemgate.Store
	// Advance moves the store's clock forward by d: miniredis FastForward,
	// or a real sleep for a real server. Required.
	Advance func(d time.Duration)
	// Lease is the unit of time of the cases that let a lease or a
	// retention run out: tiny for a fake clock, long enough for a real
	// server to answer a few calls within it. Required. (The other cases
	// claim for ten minutes, so that no claim runs out mid-case on a
	// loaded machine.)
	Lease time.Duration
	// Restart stops the server under Store and Other, as a crash would,
	// and starts it again on the same files, returning once both answer
	// (resetting their connection pools if need be); it fails t if it
	// cannot. Optional: only RunDurability calls it, and without it
	// RunDurability skips.
	Restart func(t *testing.T)
}

// second returns the client that sends the second request of a case:
// Other if the harness has one.
func (h Harness) second() idemgate.Store {
	if h.Other != nil {
		return h.Other
	}
	return h.Store
}

// keys makes the keys of one case, with the owner and kind a claim on them
// carries.
type keys func(t *testing.T) (key, owner, kind string)

// keyKinds: every case runs on plain keys (any string) and on keys derived
// by keyspace, whose owner and kind a store may take from the key.
var keyKinds = []struct {
	name string
	keys keys
}{
	{"plain", func(t *testing.T) (string, string, string) { return Key(t), "owner-a", "image" }},
	{"keyspace", func(t *testing.T) (string, string, string) {
		k := KeyspaceKey(t)
		return k.String(), k.Owner(), k.Kind()
	}},
}

// Run runs every case in parallel, each on a fresh harness from
// newHarness, once with plain keys and once with keyspace keys.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	cases := []struct {
		name string
		run  func(t *testing.T, h Harness, k keys)
	}{
		{"ClaimThenRunning", testClaimThenRunning},
		{"MismatchCarriesNothing", testMismatchCarriesNothing},
		{"CompleteThenReplay", testCompleteThenReplay},
		{"ReleaseLetsRetryClaim", testRelease},
		{"CompleteAfterRelease", testCompleteAfterRelease},
		{"WrongTokenChangesNothing", testWrongToken},
		{"LeaseExpiryAndFencing", testLeaseExpiry},
		{"ExtendKeepsClaim", testExtend},
		{"RetentionExpires", testRetention},
		{"KeysAreIndependent", testIndependent},
		{"ConcurrentClaimsOneWinner", testConcurrentClaims},
		{"ConcurrentClaimsTwoClients", testConcurrentClaimsTwoClients},
		{"CanceledContext", testCanceled},
		{"ResentClaimAndComplete", testResent},
		{"ReleaseAfterUnansweredClaim", testReleaseUnanswered},
		{"ChangedFields", testChanged},
	}
	for _, kk := range keyKinds {
		for _, tc := range cases {
			t.Run(kk.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				tc.run(t, newHarness(t), kk.keys)
			})
		}
		for _, tc := range txCases {
			t.Run(kk.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				h := newHarness(t)
				s, ok := h.Store.(idemgate.TxStore)
				if !ok {
					t.Skipf("storetest: %T does not implement idemgate.TxStore (Atomic routes)", h.Store)
				}
				tc.run(t, h, s, kk.keys)
			})
		}
	}
}

// Key returns a fresh key; random so that a shared server (or a cluster's
// slots) sees different keys per case and per run.
func Key(t *testing.T) string {
	t.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "idem:storetest:test:" + hex.EncodeToString(b[:])
}

// KeyspaceKey returns a fresh key derived by keyspace (tenant "storetest",
// kind "image", a random user and request id).
func KeyspaceKey(t *testing.T) keyspace.Key {
	t.Helper()
	var b [16]byte
	_, _ = rand.Read(b[:])
	k, err := keyspace.Derive("image", keyspace.Scope{Tenant: "storetest", User: "user-" + hex.EncodeToString(b[:8]), Request: "req-" + hex.EncodeToString(b[8:])})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func token() idemgate.Token {
	var tok idemgate.Token
	_, _ = rand.Read(tok[:])
	return tok
}

// longLease is the lease of claims that must not run out during a case.
const longLease = 10 * time.Minute

// newCase returns a fresh key and a claim on it for longLease.
func newCase(t *testing.T, k keys) (string, idemgate.ClaimRequest) {
	key, owner, kind := k(t)
	return key, idemgate.ClaimRequest{
		Fingerprint: "v1:" + fingerprint.Fingerprint(hex.EncodeToString(make([]byte, 32))),
		Owner:       owner,
		Kind:        kind,
		Lease:       longLease,
		Token:       token(),
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// claim claims key through s and fails t unless the answer is want.
func claim(t *testing.T, s idemgate.Store, key string, req idemgate.ClaimRequest, want idemgate.ClaimStatus) idemgate.ClaimResult {
	t.Helper()
	res, err := s.Claim(ctx(t), key, req)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if res.Status != want {
		t.Fatalf("Claim = %v, want %v", res.Status, want)
	}
	return res
}

// retry returns req as a retry of the same request sends it: with a
// token of its own.
func retry(req idemgate.ClaimRequest) idemgate.ClaimRequest {
	req.Token = token()
	return req
}

func sampleResponse() idemgate.Response {
	return idemgate.Response{
		Status: http.StatusCreated,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Location":     {"/v1/tasks/42"},
			"X-Multi":      {"one", "", "two, three"},
		},
		// Binary, with NUL and invalid UTF-8: replay is byte for byte.
		Body: []byte("{\"id\":42}\x00\xff\xfe\r\n"),
	}
}

// responses are the responses a replay must give back byte for byte.
func responses() map[string]idemgate.Response {
	return map[string]idemgate.Response{
		"sample":     sampleResponse(),
		"empty body": {Status: http.StatusNoContent},
		"big body":   {Status: 200, Header: http.Header{"Content-Type": {"application/octet-stream"}}, Body: bytes.Repeat([]byte{0, 1, 2, 0xff}, 64<<10)},
	}
}

// checkReplay fails t unless got is want byte for byte.
func checkReplay(t *testing.T, got, want idemgate.Response) {
	t.Helper()
	if got.Status != want.Status || !bytes.Equal(got.Body, want.Body) {
		t.Errorf("replay = %d %q, want %d %q", got.Status, trunc(got.Body), want.Status, trunc(want.Body))
	}
	if len(got.Header) != len(want.Header) || (len(want.Header) > 0 && !reflect.DeepEqual(got.Header, want.Header)) {
		t.Errorf("replay header = %v, want %v", got.Header, want.Header)
	}
}

func trunc(b []byte) []byte {
	if len(b) > 40 {
		return b[:40]
	}
	return b
}

// checkNothing fails t unless a Mismatch carries nothing: no response, no
// lease left, and no changed fields (the cases send no Fields unless they
// test them).
func checkNothing(t *testing.T, res idemgate.ClaimResult) {
	t.Helper()
	if res.Response.Status != 0 || res.Response.Header != nil || res.Response.Body != nil {
		t.Errorf("a mismatch carries a response: %d %v %q", res.Response.Status, res.Response.Header, trunc(res.Response.Body))
	}
	if res.RetryAfter != 0 {
		t.Errorf("a mismatch carries RetryAfter %v", res.RetryAfter)
	}
	if res.Changed != nil {
		t.Errorf("a mismatch carries Changed %v for a request without Fields", res.Changed)
	}
}

// checkLost fails t unless err is ErrLeaseLost.
func checkLost(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, idemgate.ErrLeaseLost) {
		t.Errorf("%s = %v, want ErrLeaseLost", what, err)
	}
}

func testClaimThenRunning(t *testing.T, h Harness, k keys) {
	key, req := newCase(t, k)
	claim(t, h.Store, key, req, idemgate.Claimed)
	res := claim(t, h.second(), key, retry(req), idemgate.Running)
	if res.RetryAfter <= 0 || res.RetryAfter > req.Lease {
		t.Errorf("RetryAfter = %v, want in (0, %v]", res.RetryAfter, req.Lease)
	}
	if res.Response.Status != 0 || res.Response.Body != nil {
		t.Errorf("a running result carries a response: %+v", res.Response)
	}
}

// mismatches are requests that differ from claimReq in exactly one of the
// three compared fields, including by case or trailing bytes.
func mismatches(req idemgate.ClaimRequest) map[string]idemgate.ClaimRequest {
	out := map[string]idemgate.ClaimRequest{}
	fp := req
	fp.Fingerprint = "v1:" + fingerprint.Fingerprint(hex.EncodeToString(bytes.Repeat([]byte{1}, 32)))
	out["fingerprint"] = fp
	owner := req
	owner.Owner = "owner-b"
	out["owner"] = owner
	ownerCase := req
	ownerCase.Owner = strings.ToUpper(req.Owner)
	out["owner case"] = ownerCase
	ownerPrefix := req
	ownerPrefix.Owner = req.Owner[:len(req.Owner)-1]
	out["owner prefix"] = ownerPrefix
	kind := req
	kind.Kind = req.Kind + "2"
	out["kind"] = kind
	kindPrefix := req
	kindPrefix.Kind = req.Kind[:len(req.Kind)-1]
	out["kind prefix"] = kindPrefix
	for name, r := range out {
		out[name] = retry(r)
	}
	return out
}

// testMismatchCarriesNothing: a request with other parameters learns only
// that the key is taken: not the stored response, not the lease left on a
// running record. The record stays as it was.
func testMismatchCarriesNothing(t *testing.T, h Harness, k keys) {
	key, req := newCase(t, k)
	claim(t, h.Store, key, req, idemgate.Claimed)
	for name, other := range mismatches(req) {
		t.Run("running/"+name, func(t *testing.T) {
			checkNothing(t, claim(t, h.second(), key, other, idemgate.Mismatch))
		})
	}
	if err := h.Store.Extend(ctx(t), key, req.Token, longLease); err != nil {
		t.Errorf("Extend by the holder after mismatches: %v", err)
	}
	if err := h.Store.Complete(ctx(t), key, req.Token, sampleResponse(), time.Hour); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	for name, other := range mismatches(req) {
		t.Run("finished/"+name, func(t *testing.T) {
			checkNothing(t, claim(t, h.second(), key, other, idemgate.Mismatch))
		})
	}
	checkReplay(t, claim(t, h.second(), key, retry(req), idemgate.Finished).Response, sampleResponse())
}

func testCompleteThenReplay(t *testing.T, h Harness, k keys) {
	for name, resp := range responses() {
		t.Run(name, func(t *testing.T) {
			key, req := newCase(t, k)
			claim(t, h.Store, key, req, idemgate.Claimed)
			if err := h.Store.Complete(ctx(t), key, req.Token, resp, time.Hour); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			again := retry(req)
			checkReplay(t, claim(t, h.second(), key, again, idemgate.Finished).Response, resp)
			// Finished: neither the old nor the new token can change it.
			checkLost(t, "Release after Complete", h.Store.Release(ctx(t), key, req.Token))
			checkLost(t, "Complete by a non-holder", h.second().Complete(ctx(t), key, again.Token, idemgate.Response{Status: 500}, time.Hour))
			checkReplay(t, claim(t, h.Store, key, again, idemgate.Finished).Response, resp)
		})
	}
}

func testRelease(t *testing.T, h Harness, k keys) {
	key, req := newCase(t, k)
	claim(t, h.Store, key, req, idemgate.Claimed)
	if err := h.Store.Release(ctx(t), key, req.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	checkLost(t, "second Release", h.Store.Release(ctx(t), key, req.Token))
	// After a release even other parameters may claim the key.
	claim(t, h.second(), key, mismatches(req)["fingerprint"], idemgate.Claimed)
}

// testCompleteAfterRelease: a handler whose claim was released (by a
// failed completion's cleanup, say) can no longer store a response: not
// while the key is free, nor once a retry holds it.
func testCompleteAfterRelease(t *testing.T, h Harness, k keys) {
	key, req := newCase(t, k)
	claim(t, h.Store, key, req, idemgate.Claimed)
	if err := h.Store.Release(ctx(t), key, req.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	checkLost(t, "Complete after Release", h.Store.Complete(ctx(t), key, req.Token, idemgate.Response{Status: 418}, time.Hour))
	checkLost(t, "Extend after Release", h.Store.Extend(ctx(t), key, req.Token, h.Lease))
	// Nothing was stored: a retry claims the key.
	next := retry(req)
	claim(t, h.second(), key, next, idemgate.Claimed)
	checkLost(t, "Complete after Release, the key held by a retry", h.Store.Complete(ctx(t), key, req.Token, idemgate.Response{Status: 418}, time.Hour))
	claim(t, h.Store, key, retry(req), idemgate.Running)
	want := sampleResponse()
	if err := h.second().Complete(ctx(t), key, next.Token, want, time.Hour); err != nil {
		t.Fatalf("the retry's Complete: %v", err)
	}
	checkReplay(t, claim(t, h.Store, key, retry(req), idemgate.Finished).Response, want)
}

// testReleaseUnanswered: after a Claim call that returned an error, the
// engine releases with the token it sent, not knowing whether the
// claim happened. If it did (even resent), the key is free again; if
// another request holds the key, or a response is stored, nothing changes.
func testReleaseUnanswered(t *testing.T, h Harness, k keys) {
	key, req := newCase(t, k)
	claim(t, h.Store, key, req, idemgate.Claimed)
	claim(t, h.Store, key, req, idemgate.Claimed) // the client library resent it
	if err := h.Store.Release(ctx(t), key, req.Token); err != nil {
		t.Fatalf("Release of a claim whose answer was lost: %v", err)
	}
	again := retry(req)
	claim(t, h.second(), key, again, idemgate.Claimed)

	// Held by another request: our claim never happened.
	lost := retry(req)
	checkLost(t, "Release with an unclaimed token", h.Store.Release(ctx(t), key, lost.Token))
	claim(t, h.Store, key, lost, idemgate.Running)

	// Finished: the stored response stays.
	if err := h.second().Complete(ctx(t), key, again.Token, sampleResponse(), time.Hour); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	for _, tok := range []idemgate.Token{lost.Token, again.Token} {
		checkLost(t, "Release of a finished record", h.Store.Release(ctx(t), key, tok))
	}
	claim(t, h.Store, key, lost, idemgate.Finished)
}

// testWrongToken: only the holder's token extends, completes or releases
// a claim, whichever client sends it.
func testWrongToken(t *testing.T, h Harness, k keys) {
	key, req := newCase(t, k)
	claim(t, h.Store, key, req, idemgate.Claimed)
	for name, s := range map[string]idemgate.Store{"same client": h.Store, "second client": h.second()} {
		t.Run(name, func(t *testing.T) {
			wrong := token()
			checkLost(t, "Extend with a wrong token", s.Extend(ctx(t), key, wrong, h.Lease))
			checkLost(t, "Complete with a wrong token", s.Complete(ctx(t), key, wrong, sampleResponse(), time.Hour))
			checkLost(t, "Release with a wrong token", s.Release(ctx(t), key, wrong))
			claim(t, s, key, retry(req), idemgate.Running)
			// Operations on a key that never existed.
			missing, _ := newCase(t, k)
			checkLost(t, "Extend of a missing key", s.Extend(ctx(t), missing, wrong, h.Lease))
			checkLost(t, "Release of a missing key", s.Release(ctx(t), missing, wrong))
		})
	}
	if err := h.Store.Complete(ctx(t), key, req.Token, sampleResponse(), time.Hour); err != nil {
		t.Errorf("the holder's Complete after wrong tokens: %v", err)
	}
}

// testLeaseExpiry: an abandoned claim is claimable after its lease (by
// another client), and the stale holder can neither extend, complete nor
// release the new holder's claim.
func testLeaseExpiry(t *testing.T, h Harness, k keys) {
	key, stale := newCase(t, k)
	stale.Lease = h.Lease
	claim(t, h.Store, key, stale, idemgate.Claimed)
	h.Advance(h.Lease + h.Lease/2)
	fresh := retry(stale)
	fresh.Lease = longLease
	claim(t, h.second(), key, fresh, idemgate.Claimed)
	checkLost(t, "stale Extend", h.Store.Extend(ctx(t), key, stale.Token, h.Lease))
	checkLost(t, "stale Complete", h.Store.Complete(ctx(t), key, stale.Token, idemgate.Response{Status: 418}, time.Hour))
	checkLost(t, "stale Release", h.Store.Release(ctx(t), key, stale.Token))
	third := retry(stale)
	claim(t, h.Store, key, third, idemgate.Running)
	want := sampleResponse()
	if err := h.second().Complete(ctx(t), key, fresh.Token, want, time.Hour); err != nil {
		t.Fatalf("fresh Complete: %v", err)
	}
	checkReplay(t, claim(t, h.Store, key, third, idemgate.Finished).Response, want)
}

// testExtend: renewals keep a claim past its lease. The claim gets a lease
// of three units and is extended every half lease, three times: each
// renewal has half a lease of slack, and without renewals the claim would
// have expired half a lease before the end.
//
// A real server keeps real time, and a loaded machine can stall the case
// for longer than the slack. A renewal that finds the claim gone proves
// nothing when a whole lease of real time passed since the last renewal
// was sent: then the case starts again on a fresh key (up to slowTries
// times). A store with a fake clock never stalls that long.
func testExtend(t *testing.T, h Harness, k keys) {
	for try := 1; ; try++ {
		if extendCase(t, h, k) || try == slowTries {
			return
		}
		t.Logf("try %d: the machine stalled for a whole lease between two renewals; again on a fresh key", try)
	}
}

// slowTries bounds the tries of a case that a stalled machine made
// inconclusive.
const slowTries = 5

// extendCase runs testExtend once and reports whether it was conclusive
// (it fails t only when it was).
func extendCase(t *testing.T, h Harness, k keys) bool {
	t.Helper()
	key, req := newCase(t, k)
	req.Lease = 3 * h.Lease
	sent := time.Now()
	claim(t, h.Store, key, req, idemgate.Claimed)
	for range 3 {
		h.Advance(req.Lease / 2)
		err := h.Store.Extend(ctx(t), key, req.Token, req.Lease)
		if errors.Is(err, idemgate.ErrLeaseLost) && time.Since(sent) >= req.Lease {
			return false
		}
		if err != nil {
			t.Fatalf("Extend %v after the last renewal was sent, of a %v lease: %v", time.Since(sent), req.Lease, err)
		}
		sent = time.Now()
	}
	res, err := h.second().Claim(ctx(t), key, retry(req))
	if err == nil && res.Status == idemgate.Claimed && time.Since(sent) >= req.Lease {
		return false
	}
	if err != nil || res.Status != idemgate.Running {
		t.Fatalf("Claim after renewals = %v, %v; want running", res.Status, err)
	}
	if err := h.Store.Complete(ctx(t), key, req.Token, sampleResponse(), time.Hour); err != nil {
		if errors.Is(err, idemgate.ErrLeaseLost) && time.Since(sent) >= req.Lease {
			return false
		}
		t.Errorf("Complete after extends: %v", err)
	}
	return true
}

// testRetention: a finished record replays within its retention and is
// gone after it. A check that a loaded machine reached only after the
// retention ran out (in real time) proves nothing and is skipped.
func testRetention(t *testing.T, h Harness, k keys) {
	key, req := newCase(t, k)
	claim(t, h.Store, key, req, idemgate.Claimed)
	retention := 2 * h.Lease
	sent := time.Now()
	if err := h.Store.Complete(ctx(t), key, req.Token, sampleResponse(), retention); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	again := retry(req)
	res, err := h.second().Claim(ctx(t), key, again)
	switch {
	case err != nil:
		t.Fatalf("Claim: %v", err)
	case res.Status == idemgate.Claimed && time.Since(sent) >= retention:
		t.Logf("the retention ran out in real time before the replay could be checked: the record expired, as it must")
		if err := h.second().Release(ctx(t), key, again.Token); err != nil {
			t.Fatalf("Release: %v", err)
		}
		return
	case res.Status != idemgate.Finished:
		t.Fatalf("Claim within the retention = %v, want finished", res.Status)
	}
	h.Advance(retention + h.Lease/2)
	claim(t, h.second(), key, again, idemgate.Claimed)
}

func testIndependent(t *testing.T, h Harness, k keys) {
	key0, req := newCase(t, k)
	keys := []string{key0, keyLike(t, key0), keyLike(t, key0)}
	for _, key := range keys {
		claim(t, h.Store, key, req, idemgate.Claimed)
	}
	if err := h.Store.Complete(ctx(t), keys[0], req.Token, sampleResponse(), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := h.Store.Release(ctx(t), keys[1], req.Token); err != nil {
		t.Fatal(err)
	}
	again := retry(req)
	claim(t, h.Store, keys[0], again, idemgate.Finished)
	claim(t, h.Store, keys[1], again, idemgate.Claimed)
	claim(t, h.Store, keys[2], again, idemgate.Running)
}

// raceRounds is how many keys the concurrent cases race for.
const raceRounds = 3

// testConcurrentClaims: many goroutines on one client claim one key at once.
func testConcurrentClaims(t *testing.T, h Harness, k keys) {
	for range raceRounds {
		concurrentClaims(t, k, []idemgate.Store{h.Store})
	}
}

// testConcurrentClaimsTwoClients: many goroutines split over two clients
// (two pools, as two nodes of a service have) claim one key at once.
func testConcurrentClaimsTwoClients(t *testing.T, h Harness, k keys) {
	if h.Other == nil {
		t.Skip("storetest: Harness.Other is nil: concurrent claims from two clients of one backend are not tested")
	}
	for range raceRounds {
		concurrentClaims(t, k, []idemgate.Store{h.Store, h.Other})
	}
}

// concurrentClaims: of many concurrent claims of one key, spread over
// clients, exactly one wins and every other one is told the key is
// running, never an error. A loser cannot complete; the winner completes
// through another client, and then every loser gets the replay.
func concurrentClaims(t *testing.T, k keys, clients []idemgate.Store) {
	t.Helper()
	key, req := newCase(t, k)
	c := ctx(t)
	const n = 64
	type attempt struct {
		client int
		req    idemgate.ClaimRequest
		res    idemgate.ClaimResult
		err    error
	}
	attempts := make([]attempt, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range attempts {
		a := &attempts[i]
		a.client, a.req = i%len(clients), retry(req)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			a.res, a.err = clients[a.client].Claim(c, key, a.req)
		}()
	}
	close(start)
	wg.Wait()
	winner := -1
	statuses := map[idemgate.ClaimStatus]int{}
	for i, a := range attempts {
		if a.err != nil {
			t.Errorf("Claim: %v", a.err)
			continue
		}
		statuses[a.res.Status]++
		if a.res.Status == idemgate.Claimed {
			winner = i
		}
	}
	if statuses[idemgate.Claimed] != 1 || statuses[idemgate.Running] != n-1 {
		t.Fatalf("statuses = %v, want 1 claimed and %d running", statuses, n-1)
	}
	w, loser := attempts[winner], attempts[(winner+1)%n]
	checkLost(t, "a loser's Complete", clients[loser.client].Complete(c, key, loser.req.Token, idemgate.Response{Status: 418}, time.Hour))
	want := sampleResponse()
	if err := clients[(w.client+1)%len(clients)].Complete(c, key, w.req.Token, want, time.Hour); err != nil {
		t.Fatalf("the winner's Complete: %v", err)
	}
	for i, a := range attempts {
		if i != winner {
			checkReplay(t, claim(t, clients[a.client], key, a.req, idemgate.Finished).Response, want)
		}
	}
}

// testCanceled: a call on a context that is already cancelled, or past its
// deadline, fails with an error that is not ErrLeaseLost (the store cannot
// tell) and changes nothing.
func testCanceled(t *testing.T, h Harness, k keys) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	for name, c := range map[string]context.Context{"canceled": canceled, "deadline": expired} {
		t.Run(name, func(t *testing.T) {
			fresh, req := newCase(t, k)
			if _, err := h.Store.Claim(c, fresh, req); err == nil {
				t.Errorf("Claim with a %s context succeeded", name)
			}
			// The claim did not happen: another request claims the key.
			claim(t, h.second(), fresh, retry(req), idemgate.Claimed)

			key, req := newCase(t, k)
			claim(t, h.Store, key, req, idemgate.Claimed)
			for op, err := range map[string]error{
				"Extend":   h.Store.Extend(c, key, req.Token, time.Hour),
				"Complete": h.Store.Complete(c, key, req.Token, idemgate.Response{Status: 418}, time.Hour),
				"Release":  h.Store.Release(c, key, req.Token),
			} {
				if err == nil || errors.Is(err, idemgate.ErrLeaseLost) {
					t.Errorf("%s with a %s context = %v, want a store error", op, name, err)
				}
			}
			// Neither completed nor released, and the lease is the claim's.
			res := claim(t, h.second(), key, retry(req), idemgate.Running)
			if res.RetryAfter > req.Lease {
				t.Errorf("RetryAfter = %v after an Extend by %v on a %s context, want at most the claim's lease %v", res.RetryAfter, time.Hour, name, req.Lease)
			}
			want := sampleResponse()
			if err := h.Store.Complete(ctx(t), key, req.Token, want, time.Hour); err != nil {
				t.Fatalf("the holder's Complete: %v", err)
			}
			checkReplay(t, claim(t, h.second(), key, retry(req), idemgate.Finished).Response, want)
		})
	}
}

// testResent: a client library resends a call whose answer it lost (go-redis
// does after a read timeout). A resent claim still holds the key, and a
// resent complete whose first attempt succeeded is no lost lease.
func testResent(t *testing.T, h Harness, k keys) {
	key, req := newCase(t, k)
	claim(t, h.Store, key, req, idemgate.Claimed)
	claim(t, h.Store, key, req, idemgate.Claimed)
	other := retry(req)
	claim(t, h.second(), key, other, idemgate.Running)
	want := sampleResponse()
	if err := h.Store.Complete(ctx(t), key, req.Token, want, time.Hour); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if err := h.Store.Complete(ctx(t), key, req.Token, want, time.Hour); err != nil {
		t.Errorf("resent Complete = %v, want nil", err)
	}
	checkReplay(t, claim(t, h.second(), key, other, idemgate.Finished).Response, want)
	// The finished record is still nobody's to change or claim.
	checkLost(t, "Complete by a non-holder", h.second().Complete(ctx(t), key, other.Token, idemgate.Response{Status: 500}, time.Hour))
	checkLost(t, "Release after Complete", h.Store.Release(ctx(t), key, req.Token))
	checkLost(t, "Extend after Complete", h.Store.Extend(ctx(t), key, req.Token, h.Lease))
	claim(t, h.Store, key, req, idemgate.Finished)
	for name, m := range mismatches(req) {
		if res := claim(t, h.Store, key, m, idemgate.Mismatch); res.Response.Body != nil {
			t.Errorf("%s: mismatch leaks the stored response", name)
		}
	}
}

// keyLike returns another key on which req's owner and kind are what they
// are on key: a plain key, or the keyspace key of the same user and kind
// with another request id.
func keyLike(t *testing.T, key string) string {
	t.Helper()
	if n := len(key); n > 129 && key[n-65] == ':' {
		var b [32]byte
		_, _ = rand.Read(b[:])
		return key[:n-64] + hex.EncodeToString(b[:])
	}
	return Key(t)
}

// testChanged: a store that keeps the fields' digests names the fields a
// mismatching claim changed, only to the record's owner and kind, and
// never with a Running or Finished answer.
func testChanged(t *testing.T, h Harness, k keys) {
	key, req := newCase(t, k)
	req.Fields = []fingerprint.FieldSum{{1}, {2}, {3}}
	claim(t, h.Store, key, req, idemgate.Claimed)

	drift := mismatches(req)["fingerprint"]
	drift.Fields = []fingerprint.FieldSum{{1}, {9}, {3}}
	if got := claim(t, h.Store, key, drift, idemgate.Mismatch).Changed; !reflect.DeepEqual(got, []int{1}) {
		t.Errorf("Changed = %v on a running record, want [1]", got)
	}
	if err := h.Store.Complete(ctx(t), key, req.Token, sampleResponse(), time.Hour); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	drift.Fields = []fingerprint.FieldSum{{8}, {2}, {3}, {7}}
	if got := claim(t, h.Store, key, drift, idemgate.Mismatch).Changed; !reflect.DeepEqual(got, []int{0, 3}) {
		t.Errorf("Changed = %v on a finished record, want [0 3]", got)
	}
	// Same fingerprint, other digests: a replay, nothing changed.
	same := req
	same.Token = token()
	same.Fields = []fingerprint.FieldSum{{4}}
	if res := claim(t, h.Store, key, same, idemgate.Finished); res.Changed != nil {
		t.Errorf("a replay carries Changed %v", res.Changed)
	}
	// Another owner or kind learns nothing, not even which fields differ.
	for name, m := range mismatches(req) {
		if name == "fingerprint" {
			continue
		}
		m.Fields = drift.Fields
		m.Fingerprint = drift.Fingerprint
		if res := claim(t, h.Store, key, m, idemgate.Mismatch); res.Changed != nil {
			t.Errorf("%s: mismatch of owner or kind carries Changed %v", name, res.Changed)
		}
	}
	// No digests on either side: nothing to tell.
	key2, plain := newCase(t, k)
	claim(t, h.Store, key2, plain, idemgate.Claimed)
	drift = mismatches(plain)["fingerprint"]
	drift.Fields = []fingerprint.FieldSum{{1}}
	if res := claim(t, h.Store, key2, drift, idemgate.Mismatch); res.Changed != nil {
		t.Errorf("Changed = %v against a record without digests", res.Changed)
	}
}
