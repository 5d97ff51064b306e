package pgrecords_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/pgrecords"
)

// TestKeyNotText: Postgres text holds neither NUL nor invalid UTF-8
// (keys derived by keyspace never carry them, but a store is called
// directly too). Every method answers a clear error: never a panic, never
// a claim, replay or ErrLeaseLost that could be taken as an answer.
func TestKeyNotText(t *testing.T) {
	t.Parallel()
	s := newStore(t, newPool(t, testenv.PostgresDSN(t)))
	for _, k := range []string{"idem:a\x00b", "idem:\xff\xfe", "\x00", "idem:" + string([]byte{0xc3, 0x28})} {
		req := request(time.Minute)
		if res, err := s.Claim(testCtx(t), k, req); err == nil {
			t.Errorf("Claim(%q) = %v, want an error", k, res.Status)
		}
		for name, err := range map[string]error{
			"Extend":   s.Extend(testCtx(t), k, req.Token, time.Minute),
			"Complete": s.Complete(testCtx(t), k, req.Token, sample(), time.Hour),
			"Release":  s.Release(testCtx(t), k, req.Token),
		} {
			if err == nil || errors.Is(err, idemgate.ErrLeaseLost) || !strings.HasPrefix(err.Error(), "pgrecords: ") {
				t.Errorf("%s(%q) = %v, want a pgrecords error other than ErrLeaseLost", name, k, err)
			}
		}
	}
	// The key that differs only after a NUL is its own key: no record of
	// "idem:a" answers for "idem:a\x00b".
	req := request(time.Minute)
	mustClaim(t, s, "idem:a", req, idemgate.Claimed)
	if res, err := s.Claim(testCtx(t), "idem:a\x00b", request(time.Minute)); err == nil {
		t.Errorf("Claim of a NUL-suffixed key = %v, want an error", res.Status)
	}
}

// TestLongKey: a key longer than a btree entry holds is refused
// with an error (and a key as long as keyspace can derive is accepted).
func TestLongKey(t *testing.T) {
	t.Parallel()
	s := newStore(t, newPool(t, testenv.PostgresDSN(t)))
	// keyspace's longest: idem: + 765 (255 escaped tenant bytes) + : + 64 + : + 64 + : + 64.
	long := "idem:" + strings.Repeat("%FF", 255) + ":" + strings.Repeat("k", 64) + ":" + strings.Repeat("a", 64) + ":" + strings.Repeat("b", 64)
	req := request(time.Minute)
	mustClaim(t, s, long, req, idemgate.Claimed)
	if err := s.Complete(testCtx(t), long, req.Token, sample(), time.Hour); err != nil {
		t.Fatal(err)
	}
	r := req
	r.Token = token()
	mustClaim(t, s, long, r, idemgate.Finished)
	// Incompressible and too long for a btree entry.
	var b strings.Builder
	for i := range 4000 {
		fmt.Fprintf(&b, "%c", 'A'+rune((i*7919)%26)+rune(i%2)*32)
	}
	huge := key() + b.String() + key() + strings.Repeat(key(), 50)
	if res, err := s.Claim(testCtx(t), huge, request(time.Minute)); err != nil {
		if !strings.HasPrefix(err.Error(), "pgrecords: claim: ") {
			t.Errorf("Claim of a %d-byte key: %v, want a pgrecords error", len(huge), err)
		}
	} else if res.Status != idemgate.Claimed {
		t.Errorf("Claim of a %d-byte key = %v", len(huge), res.Status)
	}
}

// TestIdentEdges: empty, huge, non-UTF-8 and NUL-laden owner, kind
// and fingerprint values, and pairs whose naive concatenation collides
// ("ab"+"c" vs "a"+"bc", a kind that ends the owner, a fingerprint that
// carries the kind): each pair is a mismatch, never a replay.
func TestIdentEdges(t *testing.T) {
	t.Parallel()
	s := newStore(t, newPool(t, testenv.PostgresDSN(t)))
	big := strings.Repeat("\xff\x00", 1<<16)
	type ident struct{ owner, kind, fp string }
	pairs := [][2]ident{
		{{"ab", "c", "f"}, {"a", "bc", "f"}},
		{{"a", "bc", "f"}, {"a", "b", "cf"}},
		{{"", "", ""}, {"", "", "\x00"}},
		{{"", "", ""}, {"\x00", "", ""}},
		{{"", "x", ""}, {"x", "", ""}},
		{{"\x01a", "", ""}, {"", "\x01a", ""}},
		{{"o", "k", "\x01k" + "v1:x"}, {"o", "k\x01k", "v1:x"}},
		{{big, "k", "f"}, {big[:len(big)-1], "\x00k", "f"}},
		{{"é", "k", "f"}, {"e\u0301", "k", "f"}},
		{{"\xff", "k", "f"}, {"\xfe", "k", "f"}},
		{{"o", "k", big}, {"o", "k", big + "\x00"}},
	}
	for i, p := range pairs {
		k := key()
		first := request(time.Minute)
		first.Owner, first.Kind, first.Fingerprint = p[0].owner, p[0].kind, fingerprint.Fingerprint(p[0].fp)
		mustClaim(t, s, k, first, idemgate.Claimed)
		second := first
		second.Token = token()
		second.Owner, second.Kind, second.Fingerprint = p[1].owner, p[1].kind, fingerprint.Fingerprint(p[1].fp)
		if bytes.Equal(pgrecords.Ident(first), pgrecords.Ident(second)) {
			t.Fatalf("pair %d: idents collide", i)
		}
		res := mustClaim(t, s, k, second, idemgate.Mismatch)
		if res.Response.Body != nil || res.Response.Status != 0 || res.RetryAfter != 0 {
			t.Errorf("pair %d running: mismatch carries %+v", i, res)
		}
		if err := s.Complete(testCtx(t), k, first.Token, sample(), time.Hour); err != nil {
			t.Fatal(err)
		}
		res = mustClaim(t, s, k, second, idemgate.Mismatch)
		if res.Response.Body != nil || res.Response.Status != 0 || res.Response.Header != nil {
			t.Errorf("pair %d finished: mismatch carries %+v", i, res)
		}
		again := first
		again.Token = token()
		if res := mustClaim(t, s, k, again, idemgate.Finished); !bytes.Equal(res.Response.Body, sample().Body) {
			t.Errorf("pair %d: replay body %q", i, res.Response.Body)
		}
	}
}

// TestKeysByteExact: keys that a case-folding, trimming or
// normalizing comparison would merge are different records (the primary
// key compares text byte for byte under a deterministic collation).
func TestKeysByteExact(t *testing.T) {
	t.Parallel()
	s := newStore(t, newPool(t, testenv.PostgresDSN(t)))
	base := key()
	for _, k := range []string{base + "k", base + "K", base + "k ", base + " k", base + "\u00e9", base + "e\u0301", base + "\u212a", base + "k\t"} {
		req := request(time.Hour)
		mustClaim(t, s, k, req, idemgate.Claimed)
		if err := s.Complete(testCtx(t), k, req.Token, sample(), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
}
