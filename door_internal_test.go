package idemgate

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// testDoor is the smallest Door: one route template, a fixed scope, the
// handler h, the default problem rendering.
type testDoor struct {
	template string
	h        http.Handler
}

func (d *testDoor) Route(*http.Request, any) string                  { return d.template }
func (*testDoor) Params(*http.Request, any) (names, values []string) { return nil, nil }
func (*testDoor) Matched(*http.Request, any, string) bool            { return true }
func (*testDoor) Scope(*http.Request, any) (string, string, error)   { return "acme", "alice", nil }
func (d *testDoor) Next(w http.ResponseWriter, r *http.Request, _, _ any) error {
	d.h.ServeHTTP(w, r)
	return nil
}
func (*testDoor) Problem(http.ResponseWriter, *http.Request, any, Problem) (bool, error) {
	return false, nil
}
func (*testDoor) Swap(any, http.ResponseWriter) http.ResponseWriter { return nil }
func (*testDoor) Rewound(any)                                       {}
func (*testDoor) Sent(any, int64)                                   {}

// memStore is a Store in a map, for the engine's own tests (the stores'
// conformance suite holds the real ones). Leases never run out.
type memStore struct {
	mu   sync.Mutex
	recs map[string]*memRecord
}

type memRecord struct {
	claim ClaimRequest
	done  *Response
}

func newMemStore() *memStore { return &memStore{recs: make(map[string]*memRecord)} }

func (s *memStore) Claim(_ context.Context, key string, req ClaimRequest) (ClaimResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.recs[key]
	switch {
	case !ok:
		s.recs[key] = &memRecord{claim: req}
		return ClaimResult{Status: Claimed}, nil
	case rec.claim.Fingerprint != req.Fingerprint || rec.claim.Owner != req.Owner || rec.claim.Kind != req.Kind:
		return ClaimResult{Status: Mismatch}, nil
	case rec.done != nil:
		return ClaimResult{Status: Finished, Response: *rec.done}, nil
	case rec.claim.Token == req.Token:
		return ClaimResult{Status: Claimed}, nil
	}
	return ClaimResult{Status: Running, RetryAfter: rec.claim.Lease}, nil
}

func (s *memStore) held(key string, token Token) (*memRecord, error) {
	rec, ok := s.recs[key]
	if !ok || rec.claim.Token != token || rec.done != nil {
		return nil, ErrLeaseLost
	}
	return rec, nil
}

func (s *memStore) Extend(_ context.Context, key string, token Token, _ time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := s.held(key, token)
	return err
}

func (s *memStore) Complete(_ context.Context, key string, token Token, resp Response, _ time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, err := s.held(key, token)
	if err != nil {
		return err
	}
	resp.Header = resp.Header.Clone()
	resp.Body = append([]byte(nil), resp.Body...)
	rec.done = &resp
	return nil
}

func (s *memStore) Release(_ context.Context, key string, token Token) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.held(key, token); err != nil {
		return err
	}
	delete(s.recs, key)
	return nil
}
