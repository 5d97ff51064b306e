// Package inspecttest checks that a store's idemgate.Inspector shows
// records as they are and frees only what it was shown: a release is
// fenced by the token, and the request it freed can neither extend nor
// complete the key afterwards.
package inspecttest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/keyspace"
)

// Store is a store under test.
type Store interface {
	idemgate.Store
	idemgate.Inspector
}

const lease = time.Minute

func newKey(t *testing.T) (string, idemgate.ClaimRequest) {
	t.Helper()
	k, err := keyspace.Derive("images", keyspace.Scope{Tenant: "acme", User: "alice", Request: rand.Text()})
	if err != nil {
		t.Fatal(err)
	}
	var fp [32]byte
	_, _ = rand.Read(fp[:])
	return k.String(), idemgate.ClaimRequest{Fingerprint: fingerprint.Fingerprint("v1:" + hex.EncodeToString(fp[:])),
		Owner: k.Owner(), Kind: k.Kind(), Lease: lease, Token: token(),
		Fields: []fingerprint.FieldSum{{1, 2, 3, 4}, {5, 6, 7, 8}}}
}

func token() idemgate.Token {
	var tok idemgate.Token
	_, _ = rand.Read(tok[:])
	return tok
}

func claim(t *testing.T, s Store, key string, req idemgate.ClaimRequest) {
	t.Helper()
	res, err := s.Claim(context.Background(), key, req)
	if err != nil || res.Status != idemgate.Claimed {
		t.Fatalf("claim = %v, %v", res.Status, err)
	}
}

// Run runs the checks on the store newStore returns.
func Run(t *testing.T, newStore func(t *testing.T) Store) {
	ctx := context.Background()
	t.Run("no record", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		key, _ := newKey(t)
		if _, err := s.Inspect(ctx, key); !errors.Is(err, idemgate.ErrNoRecord) {
			t.Fatalf("Inspect = %v, want ErrNoRecord", err)
		}
		if err := s.Forget(ctx, key, token(), false); !errors.Is(err, idemgate.ErrNoRecord) {
			t.Fatalf("Forget = %v, want ErrNoRecord", err)
		}
	})
	t.Run("claimed", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		key, req := newKey(t)
		claim(t, s, key, req)
		info, err := s.Inspect(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if info.Finished || info.Token != req.Token || info.Left <= 0 || info.Left > lease || info.Fields != 2 ||
			info.Status != 0 || info.Size == 0 || !strings.HasPrefix(string(req.Fingerprint), info.Fingerprint[:40]) {
			t.Fatalf("Inspect of a claim = %+v (token %v)", info, req.Token)
		}
		if info.Owner != "" && (info.Owner != req.Owner || info.Kind != req.Kind) {
			t.Fatalf("owner, kind = %q, %q", info.Owner, info.Kind)
		}
		// Fenced: another token, or the finished state, frees nothing.
		if err := s.Forget(ctx, key, token(), false); !errors.Is(err, idemgate.ErrNoRecord) {
			t.Fatalf("Forget with another token = %v", err)
		}
		if err := s.Forget(ctx, key, req.Token, true); !errors.Is(err, idemgate.ErrNoRecord) {
			t.Fatalf("Forget -finished of a claim = %v", err)
		}
		if _, err := s.Inspect(ctx, key); err != nil {
			t.Fatalf("the claim is gone after refused Forgets: %v", err)
		}
		if err := s.Forget(ctx, key, req.Token, false); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Inspect(ctx, key); !errors.Is(err, idemgate.ErrNoRecord) {
			t.Fatalf("Inspect after Forget = %v", err)
		}
		// The freed request lost its lease.
		if err := s.Extend(ctx, key, req.Token, lease); !errors.Is(err, idemgate.ErrLeaseLost) {
			t.Fatalf("Extend after Forget = %v", err)
		}
		if err := s.Complete(ctx, key, req.Token, idemgate.Response{Status: 200}, lease); !errors.Is(err, idemgate.ErrLeaseLost) {
			t.Fatalf("Complete after Forget = %v", err)
		}
	})
	t.Run("stale completion after a release and a new claim", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		key, first := newKey(t)
		claim(t, s, key, first)
		if err := s.Forget(ctx, key, first.Token, false); err != nil {
			t.Fatal(err)
		}
		retry := first
		retry.Token = token()
		claim(t, s, key, retry)
		if err := s.Complete(ctx, key, first.Token, idemgate.Response{Status: 200, Body: []byte("stale")}, lease); !errors.Is(err, idemgate.ErrLeaseLost) {
			t.Fatalf("the released request's Complete = %v, want ErrLeaseLost", err)
		}
		if err := s.Forget(ctx, key, first.Token, false); !errors.Is(err, idemgate.ErrNoRecord) {
			t.Fatalf("a second Forget of the old token = %v", err)
		}
		info, err := s.Inspect(ctx, key)
		if err != nil || info.Finished || info.Token != retry.Token {
			t.Fatalf("after the stale completion: %+v, %v", info, err)
		}
	})
	t.Run("finished", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		key, req := newKey(t)
		claim(t, s, key, req)
		resp := idemgate.Response{Status: 201, Header: http.Header{"Location": {"/v1/tasks/1"}, "Content-Type": {"application/json"}},
			Body: []byte(`{"id":"1"}`)}
		if err := s.Complete(ctx, key, req.Token, resp, time.Hour); err != nil {
			t.Fatal(err)
		}
		info, err := s.Inspect(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if !info.Finished || info.Token != req.Token || info.Status != 201 || info.BodySize != len(resp.Body) ||
			info.Header.Get("Location") != "/v1/tasks/1" || info.Left <= lease || info.Left > time.Hour {
			t.Fatalf("Inspect of a finished record = %+v", info)
		}
		if err := s.Forget(ctx, key, req.Token, false); !errors.Is(err, idemgate.ErrNoRecord) {
			t.Fatalf("Forget without finished of a finished record = %v", err)
		}
		if err := s.Forget(ctx, key, req.Token, true); err != nil {
			t.Fatal(err)
		}
		again := req
		again.Token = token()
		claim(t, s, key, again) // the stored answer is forgotten: the key runs again
	})
	t.Run("release races the handler", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		for i := range 20 {
			key, req := newKey(t)
			claim(t, s, key, req)
			var wg sync.WaitGroup
			var completeErr, forgetErr error
			wg.Go(func() {
				completeErr = s.Complete(ctx, key, req.Token, idemgate.Response{Status: 200, Body: []byte("done")}, time.Hour)
			})
			wg.Go(func() { forgetErr = s.Forget(ctx, key, req.Token, false) })
			wg.Wait()
			info, err := s.Inspect(ctx, key)
			switch {
			case completeErr == nil && errors.Is(forgetErr, idemgate.ErrNoRecord):
				if err != nil || !info.Finished {
					t.Fatalf("round %d: the completion won but the record is %+v, %v", i, info, err)
				}
			case forgetErr == nil && errors.Is(completeErr, idemgate.ErrLeaseLost):
				if !errors.Is(err, idemgate.ErrNoRecord) {
					t.Fatalf("round %d: the release won but a record is left: %+v, %v", i, info, err)
				}
			default:
				t.Fatalf("round %d: %s", i, fmt.Sprintf("Complete = %v, Forget = %v: exactly one must win", completeErr, forgetErr))
			}
		}
	})
}
