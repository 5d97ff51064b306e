package middleware

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
)

// Config configures the idempotency middleware.
type Config struct {
	// Skipper defines a function to skip middleware.
	// Optional. Default: never skip.
	Skipper middleware.Skipper

	// Store keeps the claims and the stored responses, e.g. NewRedisStore.
	// Required.
	Store Store

	// Scope reads the tenant and user from the auth context (set by the
	// auth middleware that runs before this one). An error is returned to
	// echo as is, normally a 401 from the auth layer.
	// Required.
	Scope func(c echo.Context) (tenant, user string, err error)

	// Kind names the business action, e.g. "image". It matches
	// [a-z0-9][a-z0-9_-]{0,63}; keys of different kinds never collide.
	// Optional. Default: derived from the method and route path,
	// e.g. "post-v1-images".
	Kind string

	// Fingerprint selects the body fields that take part in the parameter
	// fingerprint. The method, route template, path parameter values and
	// raw query string always take part. With Fields, a key_reused answer
	// also names the fields that changed, when the store keeps their
	// digests (RedisStore does).
	// Optional. Default: the whole body.
	Fingerprint fingerprint.Spec

	// Header is the request header that carries the idempotency key.
	// Optional. Default "Idempotency-Key".
	Header string

	// Required answers 400 key_missing to a request without the header.
	// Optional. Default false: such a request passes through unprotected.
	Required bool

	// Methods are the request methods the middleware protects; others
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
	// changed are stored: those that middleware outside this one set before
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

	// ErrorHandler renders the problems the middleware answers (key_reused,
	// request_in_progress, …) in the application's own error format. It
	// gets the problem as a value; before it runs, the answer's headers
	// already say whether a retry can succeed (x-should-retry, and
	// Retry-After when p.RetryAfter is set) and that it must not be cached
	// (Cache-Control: no-store); it may change them. An error it returns
	// goes to echo's HTTPErrorHandler. Returning nil without writing an
	// answer leaves this problem to the default, so that a handler can
	// render some codes and not others. It runs after the request's claim
	// is settled: its failure or panic never holds the key.
	// Optional. Default: an application/problem+json document (RFC 9457)
	// with the code as its "code" member.
	ErrorHandler func(c echo.Context, p Problem) error

	// Logger receives warnings: store errors and lost leases. It never
	// sees a raw key, user or body.
	// Optional. Default: no logging.
	Logger *slog.Logger

	// Atomic runs the handler inside a transaction that the Store opens
	// after a successful claim, and finishes the record in that same
	// transaction: the handler's own writes and its stored response
	// commit together, or neither does. The handler finds the transaction
	// in the request's context (pgrecords.Tx). A response the middleware
	// would store commits; any other (an error, a panic, a status
	// Cacheable refuses, a body over MaxResponseBytes) rolls back and
	// releases the claim. The whole answer is held back until the commit:
	// Flush does nothing and Hijack fails. A claim lost before the commit
	// (the lease ran out and another request took the key) rolls back and
	// is answered 503 lease_lost. Every request the route runs gets a
	// transaction, one without a key (or of a method not protected) too.
	// The Store must implement TxStore (pgrecords.Store does, RedisStore
	// cannot), and FailOpen must be false.
	// Optional. Default false.
	Atomic bool
}

// DefaultCacheable is the default Config.Cacheable: every status except
// 5xx (server trouble), 408 (timeout), 409 (conflict), 425 (too early) and
// 429 (rate limited) — outcomes a retry may change.
//
// It is idemgate.DefaultCacheable, kept here for one release.
func DefaultCacheable(status int) bool { return idemgate.DefaultCacheable(status) }

// New returns the idempotency middleware for cfg. It panics with
// "idemgate: …" on a bad config; ToMiddleware returns the error instead.
func New(cfg Config) echo.MiddlewareFunc {
	mw, err := cfg.ToMiddleware()
	if err != nil {
		panic(err)
	}
	return mw
}

// ToMiddleware validates cfg, applies the defaults to a copy, and returns
// the middleware.
func (cfg Config) ToMiddleware() (echo.MiddlewareFunc, error) {
	m, err := idemgate.NewEngine(cfg.engine())
	if cfg.Scope == nil {
		err = errors.Join(err, errors.New("idemgate: Scope is required"))
	}
	if err != nil {
		return nil, err
	}
	if cfg.Skipper == nil {
		cfg.Skipper = middleware.DefaultSkipper
	}
	d := &door{cfg: &cfg}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if cfg.Skipper(c) {
				return next(c)
			}
			return m.Serve(c.Response(), c.Request(), d, c, next)
		}
	}, nil
}

// engine returns the engine's part of cfg.
func (cfg *Config) engine() idemgate.EngineConfig {
	return idemgate.EngineConfig{
		Store:            cfg.Store,
		Kind:             cfg.Kind,
		Fingerprint:      cfg.Fingerprint,
		Header:           cfg.Header,
		Required:         cfg.Required,
		Methods:          cfg.Methods,
		Retention:        cfg.Retention,
		Lease:            cfg.Lease,
		WaitInFlight:     cfg.WaitInFlight,
		MismatchStatus:   cfg.MismatchStatus,
		Cacheable:        cfg.Cacheable,
		MaxBodyBytes:     cfg.MaxBodyBytes,
		MaxResponseBytes: cfg.MaxResponseBytes,
		ReplayHeaders:    cfg.ReplayHeaders,
		FailOpen:         cfg.FailOpen,
		OnEvent:          cfg.OnEvent,
		Logger:           cfg.Logger,
		Atomic:           cfg.Atomic,
	}
}
