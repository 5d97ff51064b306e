// Package storetest is the conformance suite for middleware.Store: every
// store idemgate ships (Redis on miniredis, a redis-server and a Redis
// Cluster; PostgreSQL in package pgrecords) runs it, and so should a store
// you write yourself (DynamoDB, Spanner, …).
//
// Run calls your harness once per case and runs each case twice: on plain
// keys (any string) and on keys derived by package keyspace, whose owner
// and kind a store may take from the key. The cases cover claiming and
// its answers (Running with the lease left, Finished with the response
// byte for byte, Mismatch carrying nothing of it), fencing by token after
// a lease runs out, extend, release, retention, a resent claim and a
// resent complete, a release after a claim whose answer was lost,
// concurrent claims of one key (one winner), cancelled contexts, and the
// changed fields of a Mismatch (for a store that keeps them).
//
// A store on a real server uses real time: Advance sleeps, and Lease is
// long enough for the server to answer within it. A store with a fake
// clock advances the clock instead. Cases run in parallel and use random
// keys, so one store (one database) may serve every case.
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

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/keyspace"
	"github.com/idemgate/idemgate/middleware"
)

// Harness is one store under test.
type Harness struct {
	// Store is the store under test; each case gets a new harness.
	Store middleware.Store
	// Advance moves the store's clock forward by d: miniredis FastForward,
	// or a real sleep for a real server.
	Advance func(d time.Duration)
	// Lease is the lease (and unit of time) the cases use: tiny for a
	// fake clock, long enough for real servers to answer within it.
	Lease time.Duration
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

// Run runs every case, each on a fresh harness from newHarness, once with
// plain keys and once with keyspace keys.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	cases := []struct {
		name string
		run  func(t *testing.T, h Harness, k keys)
	}{
		{"ClaimThenRunning", testClaimThenRunning},
		{"MismatchRunning", testMismatchRunning},
		{"CompleteThenReplay", testCompleteThenReplay},
		{"MismatchFinishedHidesResponse", testMismatchFinished},
		{"ReleaseLetsRetryClaim", testRelease},
		{"WrongTokenChangesNothing", testWrongToken},
		{"LeaseExpiryAndFencing", testLeaseExpiry},
		{"ExtendKeepsClaim", testExtend},
		{"RetentionExpires", testRetention},
		{"KeysAreIndependent", testIndependent},
		{"ConcurrentClaimsOneWinner", testConcurrentClaims},
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

func token() middleware.Token {
	var tok middleware.Token
	_, _ = rand.Read(tok[:])
	return tok
}

// newCase returns a fresh key and a claim on it.
func newCase(t *testing.T, h Harness, k keys) (string, middleware.ClaimRequest) {
	key, owner, kind := k(t)
	return key, middleware.ClaimRequest{
		Fingerprint: "v1:" + fingerprint.Fingerprint(hex.EncodeToString(make([]byte, 32))),
		Owner:       owner,
		Kind:        kind,
		Lease:       h.Lease,
		Token:       token(),
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func claim(t *testing.T, h Harness, key string, req middleware.ClaimRequest, want middleware.ClaimStatus) middleware.ClaimResult {
	t.Helper()
	res, err := h.Store.Claim(ctx(t), key, req)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if res.Status != want {
		t.Fatalf("Claim = %v, want %v", res.Status, want)
	}
	return res
}

func sampleResponse() middleware.Response {
	return middleware.Response{
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

func testClaimThenRunning(t *testing.T, h Harness, k keys) {
	key, req := newCase(t, h, k)
	claim(t, h, key, req, middleware.Claimed)
	again := req
	again.Token = token()
	res := claim(t, h, key, again, middleware.Running)
	if res.RetryAfter <= 0 || res.RetryAfter > h.Lease {
		t.Errorf("RetryAfter = %v, want in (0, %v]", res.RetryAfter, h.Lease)
	}
	if res.Response.Status != 0 || res.Response.Body != nil {
		t.Errorf("a running result carries a response: %+v", res.Response)
	}
}

// mismatches are requests that differ from claimReq in exactly one of the
// three compared fields, including by case or trailing bytes.
func mismatches(req middleware.ClaimRequest) map[string]middleware.ClaimRequest {
	out := map[string]middleware.ClaimRequest{}
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
		r.Token = token()
		out[name] = r
	}
	return out
}

func testMismatchRunning(t *testing.T, h Harness, k keys) {
	key, req := newCase(t, h, k)
	claim(t, h, key, req, middleware.Claimed)
	for name, other := range mismatches(req) {
		t.Run(name, func(t *testing.T) {
			res := claim(t, h, key, other, middleware.Mismatch)
			if res.RetryAfter != 0 {
				t.Errorf("mismatch carries RetryAfter %v", res.RetryAfter)
			}
		})
	}
	// The holder still holds it.
	if err := h.Store.Extend(ctx(t), key, req.Token, h.Lease); err != nil {
		t.Errorf("Extend by the holder after mismatches: %v", err)
	}
}

func testCompleteThenReplay(t *testing.T, h Harness, k keys) {
	for name, resp := range map[string]middleware.Response{
		"sample":     sampleResponse(),
		"empty body": {Status: http.StatusNoContent},
		"big body":   {Status: 200, Header: http.Header{"Content-Type": {"application/octet-stream"}}, Body: bytes.Repeat([]byte{0, 1, 2, 0xff}, 64<<10)},
	} {
		t.Run(name, func(t *testing.T) {
			key, req := newCase(t, h, k)
			claim(t, h, key, req, middleware.Claimed)
			if err := h.Store.Complete(ctx(t), key, req.Token, resp, time.Hour); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			again := req
			again.Token = token()
			got := claim(t, h, key, again, middleware.Finished).Response
			if got.Status != resp.Status || !bytes.Equal(got.Body, resp.Body) {
				t.Errorf("replay = %d %q, want %d %q", got.Status, trunc(got.Body), resp.Status, trunc(resp.Body))
			}
			if len(got.Header) != len(resp.Header) || (len(resp.Header) > 0 && !reflect.DeepEqual(got.Header, resp.Header)) {
				t.Errorf("replay header = %v, want %v", got.Header, resp.Header)
			}
			// Finished: neither the old nor the new token can change it.
			if err := h.Store.Release(ctx(t), key, req.Token); !errors.Is(err, middleware.ErrLeaseLost) {
				t.Errorf("Release after Complete = %v, want ErrLeaseLost", err)
			}
			if err := h.Store.Complete(ctx(t), key, again.Token, middleware.Response{Status: 500}, time.Hour); !errors.Is(err, middleware.ErrLeaseLost) {
				t.Errorf("Complete by a non-holder = %v, want ErrLeaseLost", err)
			}
			claim(t, h, key, again, middleware.Finished)
		})
	}
}

func trunc(b []byte) []byte {
	if len(b) > 40 {
		return b[:40]
	}
	return b
}

func testMismatchFinished(t *testing.T, h Harness, k keys) {
	key, req := newCase(t, h, k)
	claim(t, h, key, req, middleware.Claimed)
	if err := h.Store.Complete(ctx(t), key, req.Token, sampleResponse(), time.Hour); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	for name, other := range mismatches(req) {
		t.Run(name, func(t *testing.T) {
			res := claim(t, h, key, other, middleware.Mismatch)
			if res.Response.Status != 0 || res.Response.Header != nil || res.Response.Body != nil {
				t.Errorf("mismatch leaks the stored response: %+v", res.Response)
			}
		})
	}
}

func testRelease(t *testing.T, h Harness, k keys) {
	key, req := newCase(t, h, k)
	claim(t, h, key, req, middleware.Claimed)
	if err := h.Store.Release(ctx(t), key, req.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := h.Store.Release(ctx(t), key, req.Token); !errors.Is(err, middleware.ErrLeaseLost) {
		t.Errorf("second Release = %v, want ErrLeaseLost", err)
	}
	if err := h.Store.Complete(ctx(t), key, req.Token, sampleResponse(), time.Hour); !errors.Is(err, middleware.ErrLeaseLost) {
		t.Errorf("Complete after Release = %v, want ErrLeaseLost", err)
	}
	// After a release even other parameters may claim the key.
	other := mismatches(req)["fingerprint"]
	claim(t, h, key, other, middleware.Claimed)
}

// testReleaseUnanswered: after a Claim call that returned an error, the
// middleware releases with the token it sent, not knowing whether the
// claim happened. If it did (even resent), the key is free again; if
// another request holds the key, or a response is stored, nothing changes.
func testReleaseUnanswered(t *testing.T, h Harness, k keys) {
	key, req := newCase(t, h, k)
	claim(t, h, key, req, middleware.Claimed)
	claim(t, h, key, req, middleware.Claimed) // the client library resent it
	if err := h.Store.Release(ctx(t), key, req.Token); err != nil {
		t.Fatalf("Release of a claim whose answer was lost: %v", err)
	}
	again := req
	again.Token = token()
	claim(t, h, key, again, middleware.Claimed)

	// Held by another request: our claim never happened.
	lost := req
	lost.Token = token()
	if err := h.Store.Release(ctx(t), key, lost.Token); !errors.Is(err, middleware.ErrLeaseLost) {
		t.Errorf("Release with an unclaimed token = %v, want ErrLeaseLost", err)
	}
	claim(t, h, key, lost, middleware.Running)

	// Finished: the stored response stays.
	if err := h.Store.Complete(ctx(t), key, again.Token, sampleResponse(), time.Hour); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	for _, tok := range []middleware.Token{lost.Token, again.Token} {
		if err := h.Store.Release(ctx(t), key, tok); !errors.Is(err, middleware.ErrLeaseLost) {
			t.Errorf("Release of a finished record = %v, want ErrLeaseLost", err)
		}
	}
	claim(t, h, key, lost, middleware.Finished)
}

func testWrongToken(t *testing.T, h Harness, k keys) {
	key, req := newCase(t, h, k)
	claim(t, h, key, req, middleware.Claimed)
	wrong := token()
	if err := h.Store.Extend(ctx(t), key, wrong, h.Lease); !errors.Is(err, middleware.ErrLeaseLost) {
		t.Errorf("Extend with a wrong token = %v, want ErrLeaseLost", err)
	}
	if err := h.Store.Complete(ctx(t), key, wrong, sampleResponse(), time.Hour); !errors.Is(err, middleware.ErrLeaseLost) {
		t.Errorf("Complete with a wrong token = %v, want ErrLeaseLost", err)
	}
	if err := h.Store.Release(ctx(t), key, wrong); !errors.Is(err, middleware.ErrLeaseLost) {
		t.Errorf("Release with a wrong token = %v, want ErrLeaseLost", err)
	}
	again := req
	again.Token = token()
	claim(t, h, key, again, middleware.Running)
	// Operations on a key that never existed.
	missing, _ := newCase(t, h, k)
	if err := h.Store.Extend(ctx(t), missing, wrong, h.Lease); !errors.Is(err, middleware.ErrLeaseLost) {
		t.Errorf("Extend of a missing key = %v, want ErrLeaseLost", err)
	}
	if err := h.Store.Release(ctx(t), missing, wrong); !errors.Is(err, middleware.ErrLeaseLost) {
		t.Errorf("Release of a missing key = %v, want ErrLeaseLost", err)
	}
}

// testLeaseExpiry: an abandoned claim is claimable after its lease, and the
// stale holder can neither complete nor release the new holder's claim.
func testLeaseExpiry(t *testing.T, h Harness, k keys) {
	key, stale := newCase(t, h, k)
	claim(t, h, key, stale, middleware.Claimed)
	h.Advance(h.Lease + h.Lease/2)
	fresh := stale
	fresh.Token = token()
	claim(t, h, key, fresh, middleware.Claimed)
	if err := h.Store.Extend(ctx(t), key, stale.Token, h.Lease); !errors.Is(err, middleware.ErrLeaseLost) {
		t.Errorf("stale Extend = %v, want ErrLeaseLost", err)
	}
	if err := h.Store.Complete(ctx(t), key, stale.Token, middleware.Response{Status: 418}, time.Hour); !errors.Is(err, middleware.ErrLeaseLost) {
		t.Errorf("stale Complete = %v, want ErrLeaseLost", err)
	}
	if err := h.Store.Release(ctx(t), key, stale.Token); !errors.Is(err, middleware.ErrLeaseLost) {
		t.Errorf("stale Release = %v, want ErrLeaseLost", err)
	}
	third := stale
	third.Token = token()
	claim(t, h, key, third, middleware.Running)
	want := sampleResponse()
	if err := h.Store.Complete(ctx(t), key, fresh.Token, want, time.Hour); err != nil {
		t.Fatalf("fresh Complete: %v", err)
	}
	if got := claim(t, h, key, third, middleware.Finished).Response; got.Status != want.Status || !bytes.Equal(got.Body, want.Body) {
		t.Errorf("replay = %d %q, want the fresh holder's %d", got.Status, got.Body, want.Status)
	}
}

// testExtend: renewals keep a claim past its lease. The claim gets a lease
// of three units and is extended every half lease, three times: each
// renewal has half a lease of slack (900 ms on a real server under the
// default harness), and without renewals the claim would have expired half
// a lease before the end.
func testExtend(t *testing.T, h Harness, k keys) {
	key, req := newCase(t, h, k)
	req.Lease = 3 * h.Lease
	claim(t, h, key, req, middleware.Claimed)
	for range 3 {
		h.Advance(req.Lease / 2)
		if err := h.Store.Extend(ctx(t), key, req.Token, req.Lease); err != nil {
			t.Fatalf("Extend: %v", err)
		}
	}
	again := req
	again.Token = token()
	claim(t, h, key, again, middleware.Running)
	if err := h.Store.Complete(ctx(t), key, req.Token, sampleResponse(), time.Hour); err != nil {
		t.Errorf("Complete after extends: %v", err)
	}
}

func testRetention(t *testing.T, h Harness, k keys) {
	key, req := newCase(t, h, k)
	claim(t, h, key, req, middleware.Claimed)
	retention := 2 * h.Lease
	if err := h.Store.Complete(ctx(t), key, req.Token, sampleResponse(), retention); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	again := req
	again.Token = token()
	claim(t, h, key, again, middleware.Finished)
	h.Advance(retention + h.Lease/2)
	claim(t, h, key, again, middleware.Claimed)
}

func testIndependent(t *testing.T, h Harness, k keys) {
	key0, req := newCase(t, h, k)
	keys := []string{key0, keyLike(t, key0), keyLike(t, key0)}
	for _, key := range keys {
		claim(t, h, key, req, middleware.Claimed)
	}
	if err := h.Store.Complete(ctx(t), keys[0], req.Token, sampleResponse(), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := h.Store.Release(ctx(t), keys[1], req.Token); err != nil {
		t.Fatal(err)
	}
	again := req
	again.Token = token()
	claim(t, h, keys[0], again, middleware.Finished)
	claim(t, h, keys[1], again, middleware.Claimed)
	claim(t, h, keys[2], again, middleware.Running)
}

func testConcurrentClaims(t *testing.T, h Harness, k keys) {
	key, req := newCase(t, h, k)
	const n = 50
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[middleware.ClaimStatus]int{}
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := req
			r.Token = token()
			res, err := h.Store.Claim(ctx(t), key, r)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("Claim: %v", err)
				return
			}
			statuses[res.Status]++
		}()
	}
	wg.Wait()
	if statuses[middleware.Claimed] != 1 || statuses[middleware.Running] != n-1 {
		t.Errorf("statuses = %v, want 1 claimed and %d running", statuses, n-1)
	}
}

func testCanceled(t *testing.T, h Harness, k keys) {
	c, cancel := context.WithCancel(context.Background())
	cancel()
	key, req := newCase(t, h, k)
	if _, err := h.Store.Claim(c, key, req); err == nil {
		t.Errorf("Claim with a canceled context succeeded")
	}
}

// testResent: a client library resends a call whose answer it lost (go-redis
// does after a read timeout). A resent claim still holds the key, and a
// resent complete whose first attempt succeeded is no lost lease.
func testResent(t *testing.T, h Harness, k keys) {
	key, req := newCase(t, h, k)
	claim(t, h, key, req, middleware.Claimed)
	claim(t, h, key, req, middleware.Claimed)
	other := req
	other.Token = token()
	claim(t, h, key, other, middleware.Running)
	want := sampleResponse()
	if err := h.Store.Complete(ctx(t), key, req.Token, want, time.Hour); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if err := h.Store.Complete(ctx(t), key, req.Token, want, time.Hour); err != nil {
		t.Errorf("resent Complete = %v, want nil", err)
	}
	if got := claim(t, h, key, other, middleware.Finished).Response; got.Status != want.Status || !bytes.Equal(got.Body, want.Body) {
		t.Errorf("replay = %d %q, want %d %q", got.Status, got.Body, want.Status, want.Body)
	}
	// The finished record is still nobody's to change or claim.
	if err := h.Store.Complete(ctx(t), key, other.Token, middleware.Response{Status: 500}, time.Hour); !errors.Is(err, middleware.ErrLeaseLost) {
		t.Errorf("Complete by a non-holder = %v, want ErrLeaseLost", err)
	}
	if err := h.Store.Release(ctx(t), key, req.Token); !errors.Is(err, middleware.ErrLeaseLost) {
		t.Errorf("Release after Complete = %v, want ErrLeaseLost", err)
	}
	if err := h.Store.Extend(ctx(t), key, req.Token, h.Lease); !errors.Is(err, middleware.ErrLeaseLost) {
		t.Errorf("Extend after Complete = %v, want ErrLeaseLost", err)
	}
	claim(t, h, key, req, middleware.Finished)
	for name, m := range mismatches(req) {
		if res := claim(t, h, key, m, middleware.Mismatch); res.Response.Body != nil {
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
	key, req := newCase(t, h, k)
	req.Fields = []fingerprint.FieldSum{{1}, {2}, {3}}
	claim(t, h, key, req, middleware.Claimed)

	drift := mismatches(req)["fingerprint"]
	drift.Fields = []fingerprint.FieldSum{{1}, {9}, {3}}
	if got := claim(t, h, key, drift, middleware.Mismatch).Changed; !reflect.DeepEqual(got, []int{1}) {
		t.Errorf("Changed = %v on a running record, want [1]", got)
	}
	if err := h.Store.Complete(ctx(t), key, req.Token, sampleResponse(), time.Hour); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	drift.Fields = []fingerprint.FieldSum{{8}, {2}, {3}, {7}}
	if got := claim(t, h, key, drift, middleware.Mismatch).Changed; !reflect.DeepEqual(got, []int{0, 3}) {
		t.Errorf("Changed = %v on a finished record, want [0 3]", got)
	}
	// Same fingerprint, other digests: a replay, nothing changed.
	same := req
	same.Token = token()
	same.Fields = []fingerprint.FieldSum{{4}}
	if res := claim(t, h, key, same, middleware.Finished); res.Changed != nil {
		t.Errorf("a replay carries Changed %v", res.Changed)
	}
	// Another owner or kind learns nothing, not even which fields differ.
	for name, m := range mismatches(req) {
		if name == "fingerprint" {
			continue
		}
		m.Fields = drift.Fields
		m.Fingerprint = drift.Fingerprint
		if res := claim(t, h, key, m, middleware.Mismatch); res.Changed != nil {
			t.Errorf("%s: mismatch of owner or kind carries Changed %v", name, res.Changed)
		}
	}
	// No digests on either side: nothing to tell.
	key2, plain := newCase(t, h, k)
	claim(t, h, key2, plain, middleware.Claimed)
	drift = mismatches(plain)["fingerprint"]
	drift.Fields = []fingerprint.FieldSum{{1}}
	if res := claim(t, h, key2, drift, middleware.Mismatch); res.Changed != nil {
		t.Errorf("Changed = %v against a record without digests", res.Changed)
	}
}
