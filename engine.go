package idemgate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/keyspace"
)

// EngineConfig configures an Engine: everything about a protected route
// that is no framework's. An adapter's own Config adds what is (a
// Skipper, the scope, error rendering) and builds an Engine from the
// rest.
type EngineConfig struct {
	// Store keeps the claims and the stored responses, e.g.
	// redisstore.New or pgrecords.New.
	// Required.
	Store Store

	// Kind names the business action, e.g. "image". It matches
	// [a-z0-9][a-z0-9_-]{0,63}; keys of different kinds never collide.
	// Optional. Default: derived from the method and route path,
	// e.g. "post-v1-images".
	Kind string

	// Fingerprint selects the body fields that take part in the parameter
	// fingerprint. The method, route template, path parameter values and
	// raw query string always take part. With Fields, a key_reused answer
	// also names the fields that changed, when the store keeps their
	// digests (the Redis store does).
	// Optional. Default: the whole body.
	Fingerprint fingerprint.Spec

	// Header is the request header that carries the idempotency key.
	// Optional. Default "Idempotency-Key".
	Header string

	// Required answers 400 key_missing to a request without the header.
	// Optional. Default false: such a request passes through unprotected.
	Required bool

	// Methods are the request methods the engine protects; others
	// pass through.
	// Optional. Default POST, PATCH.
	Methods []string

	// Retention is how long a finished response is kept for replay.
	// Optional. Default 24h.
	Retention time.Duration

	// Lease is how long a claim lives without renewal. It is renewed every
	// Lease/3 while the handler runs (a renewal that failed is tried again
	// Lease/3 after it began, at least Lease/12 after it ended), so it
	// bounds how long a crashed holder blocks retries.
	// Optional. Default 30s.
	Lease time.Duration

	// WaitInFlight is how long a request waits for another one holding its
	// key before answering 409 request_in_progress; when the other one
	// finishes in time, its response is replayed.
	// Optional. Default 0: answer 409 at once.
	WaitInFlight time.Duration

	// MismatchStatus is the status of a key_reused answer (a key used
	// again with other parameters). It must be a 4xx.
	// Optional. Default 409; 422 for the IETF draft's choice.
	MismatchStatus int

	// Cacheable reports whether a response with this status is stored for
	// replay. Others release the claim so that a retry runs the handler.
	// Optional. Default: every status except 5xx, 408, 409, 425 and 429.
	Cacheable func(status int) bool

	// MaxBodyBytes bounds the request body read for the fingerprint; a
	// larger body is answered 413 body_too_large.
	// Optional. Default 1 MiB.
	MaxBodyBytes int64

	// MaxResponseBytes bounds the response body stored for replay; a larger
	// one is streamed through to the client, not stored, and the claim
	// released.
	// Optional. Default 1 MiB.
	MaxResponseBytes int64

	// ReplayHeaders, when not empty, is the allowlist of response headers
	// stored and replayed. Either way only headers the handler set or
	// changed are stored: those that middleware outside the engine set before
	// the handler ran (a request id) are that middleware's to set afresh on
	// the replay.
	// Optional. Default: every header the handler set except hop-by-hop
	// ones, Date, Content-Length and Set-Cookie.
	ReplayHeaders []string

	// FailOpen runs the handler unprotected when the store is unreachable,
	// instead of answering 503 store_unavailable.
	// Optional. Default false (fail closed).
	FailOpen bool

	// OnEvent receives an Event for each step of each protected request,
	// for metrics and logs, with the request's context: its values (the
	// request's trace span, a request-scoped logger) without its
	// cancellation, so that an event after the client left is still
	// reported. Events of the lease renewal get the renewal's own context,
	// which carries the same values. It runs on the request's goroutine
	// (or the renewal's), so it must be fast and safe for concurrent use:
	// the request waits for it.
	// Optional.
	OnEvent func(ctx context.Context, ev Event)

	// Logger receives warnings: store errors and lost leases. It never
	// sees a raw key, user or body.
	// Optional. Default: no logging.
	Logger *slog.Logger

	// Atomic runs the handler inside a transaction that the Store opens
	// after a successful claim, and finishes the record in that same
	// transaction: the handler's own writes and its stored response
	// commit together, or neither does. The handler finds the transaction
	// in the request's context (pgrecords.Tx). A response the engine
	// would store commits; any other (an error, a panic, a status
	// Cacheable refuses, a body over MaxResponseBytes) rolls back and
	// releases the claim. The whole answer is held back until the commit:
	// Flush does nothing and Hijack fails. A claim lost before the commit
	// (the lease ran out and another request took the key) rolls back and
	// is answered 503 lease_lost. Every request the route runs gets a
	// transaction, one without a key (or of a method not protected) too.
	// The Store must implement TxStore (pgrecords.Store does, the Redis store
	// cannot), and FailOpen must be false.
	// Optional. Default false.
	Atomic bool
}

// Defaults of EngineConfig.
const (
	defaultHeader           = "Idempotency-Key"
	defaultRetention        = 24 * time.Hour
	defaultLease            = 30 * time.Second
	defaultMismatchStatus   = http.StatusConflict
	defaultMaxBodyBytes     = 1 << 20
	defaultMaxResponseBytes = 1 << 20
)

// DefaultCacheable is the default EngineConfig.Cacheable: every status except
// 5xx (server trouble), 408 (timeout), 409 (conflict), 425 (too early) and
// 429 (rate limited) — outcomes a retry may change.
func DefaultCacheable(status int) bool {
	switch {
	case status >= 500:
		return false
	case status == http.StatusRequestTimeout, status == http.StatusConflict,
		status == http.StatusTooEarly, status == http.StatusTooManyRequests:
		return false
	}
	return true
}

// NewEngine validates cfg, applies the defaults to a copy, and returns the
// Engine. Its errors start with "idemgate: "; several are joined.
func NewEngine(cfg EngineConfig) (*Engine, error) {
	return newEngine(cfg, time.Now)
}

// newEngine is NewEngine on the clock now, which tests replace.
func newEngine(cfg EngineConfig, now func() time.Time) (*Engine, error) {
	// cfg is a copy, but its slices are the caller's: a caller changing
	// them later must not change (or race with) the protection.
	cfg.Methods = slices.Clone(cfg.Methods)
	cfg.Fingerprint.Fields = slices.Clone(cfg.Fingerprint.Fields)
	cfg.Fingerprint.Exclude = slices.Clone(cfg.Fingerprint.Exclude)
	cfg.ReplayHeaders = slices.Clone(cfg.ReplayHeaders)
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("idemgate: "+format, args...))
	}
	if cfg.Store == nil {
		bad("Store is required")
	}
	var txStore TxStore
	if cfg.Atomic {
		var ok bool
		if txStore, ok = cfg.Store.(TxStore); !ok && cfg.Store != nil {
			bad("Atomic needs a Store that implements TxStore (pgrecords.Store does): %T cannot commit a record in the handler's database transaction", cfg.Store)
		}
		if cfg.FailOpen {
			bad("FailOpen cannot be combined with Atomic: an Atomic handler needs the store's transaction, which an unreachable store cannot give")
		}
	}
	if cfg.Kind != "" {
		if _, err := keyspace.Derive(cfg.Kind, keyspace.Scope{Tenant: "t", User: "u", Request: "r"}); err != nil {
			bad("Kind %q: %w", cfg.Kind, err)
		}
	}
	fp, err := cfg.Fingerprint.Compile()
	if err != nil {
		bad("Fingerprint: %w", err)
	}
	if cfg.Header == "" {
		cfg.Header = defaultHeader
	}
	if !isToken(cfg.Header) {
		bad("Header %q is not a header name", cfg.Header)
	}
	if len(cfg.Methods) == 0 {
		cfg.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	for _, method := range cfg.Methods {
		if !isToken(method) {
			bad("Methods: %q is not a method", method)
		}
	}
	durations := []struct {
		name string
		d    *time.Duration
		def  time.Duration
	}{
		{"Retention", &cfg.Retention, defaultRetention},
		{"Lease", &cfg.Lease, defaultLease},
		{"WaitInFlight", &cfg.WaitInFlight, 0},
	}
	for _, d := range durations {
		switch {
		case *d.d < 0:
			bad("%s must not be negative, got %v", d.name, *d.d)
		case *d.d == 0:
			*d.d = d.def
		case *d.d < time.Millisecond:
			bad("%s must be at least 1ms, got %v", d.name, *d.d)
		}
	}
	if cfg.MismatchStatus == 0 {
		cfg.MismatchStatus = defaultMismatchStatus
	}
	if cfg.MismatchStatus < 400 || cfg.MismatchStatus > 499 {
		bad("MismatchStatus must be a 4xx, got %d", cfg.MismatchStatus)
	}
	if cfg.Cacheable == nil {
		cfg.Cacheable = DefaultCacheable
	}
	for _, n := range []struct {
		name string
		v    *int64
		def  int64
	}{
		{"MaxBodyBytes", &cfg.MaxBodyBytes, defaultMaxBodyBytes},
		{"MaxResponseBytes", &cfg.MaxResponseBytes, defaultMaxResponseBytes},
	} {
		switch {
		case *n.v < 0:
			bad("%s must not be negative, got %d", n.name, *n.v)
		case *n.v == 0:
			*n.v = n.def
		}
	}
	filter := &headerFilter{}
	for _, h := range cfg.ReplayHeaders {
		if !isToken(h) {
			bad("ReplayHeaders: %q is not a header name", h)
			continue
		}
		if filter.allow == nil {
			filter.allow = make(map[string]bool, len(cfg.ReplayHeaders))
		}
		filter.allow[http.CanonicalHeaderKey(h)] = true
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &Engine{
		cfg:    cfg,
		now:    now,
		tx:     txStore,
		header: http.CanonicalHeaderKey(cfg.Header),
		filter: filter,
		fp:     fp,
		routes: make(map[routeKey]*route),
	}, nil
}

// isToken reports whether s is an RFC 9110 token (header names, methods).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			continue
		}
		switch c {
		case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
			continue
		}
		return false
	}
	return true
}
