// Package idemhttp protects net/http handlers with idempotency keys: the
// idemgate engine behind a func(http.Handler) http.Handler, with the
// standard library only.
//
// A request with an Idempotency-Key header runs its handler once; a retry
// with the same key and the same parameters gets the stored answer byte
// for byte (Idempotent-Replayed: true), one with other parameters 409
// key_reused, and one while the first still runs 409
// request_in_progress. The route template and path values come from Go's
// ServeMux (Request.Pattern, Request.PathValue), so wrap each route's
// handler:
//
//	mw := idemhttp.New(idemhttp.Config{Store: store, Scope: scope})
//	mux.Handle("POST /v1/orders/{id}/refund", mw(refund))
//
// Wrapping the whole mux instead (mw(mux)) runs the middleware before
// the mux routes, when r.Pattern is still empty: the middleware asks the
// mux (ServeMux.Handler) which pattern it will choose. That pattern gives
// the kind, as on a wrapped route, and the escaped path stands for the
// path values in the fingerprint; a request the mux answers 404 or 405,
// or redirects, passes through untouched. A router that keeps its template elsewhere
// (chi, gorilla/mux) gives it through Config.Route.
package idemhttp

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
)

// Config configures the idempotency middleware.
type Config struct {
	// Skipper defines a function to skip the middleware: a request it
	// reports true for goes to the handler as it is.
	// Optional. Default: never skip.
	Skipper func(r *http.Request) bool

	// Store keeps the claims and the stored responses, e.g.
	// redisstore.New or pgrecords.New.
	// Required.
	Store idemgate.Store

	// Scope reads the tenant and user from the request (its context, as
	// the authentication middleware before this one left it). An error
	// answers 401 Unauthorized: an unauthenticated request should not
	// have reached a protected route.
	// Required.
	Scope func(r *http.Request) (tenant, user string, err error)

	// Route returns the route template the router chose for r, e.g.
	// "/v1/orders/{id}/refund". The template names the kind (when Kind is
	// empty) and takes part in the fingerprint with the method, the raw
	// query and the values of its wildcards ({name}, {name...},
	// {name:regexp}), read with PathValue. An empty template means the
	// router has not chosen one: the path itself is then the target. It
	// must be the route's template, never the request's path: the engine
	// keeps what it derives (the kind, the route's fingerprint frame) once
	// per method and template.
	// Optional. Default: Go's ServeMux: the path part of r.Pattern (its
	// method and host left out).
	Route func(r *http.Request) string

	// PathValue returns the value of the path parameter name of r, for
	// routers that keep them elsewhere than r.PathValue (gorilla/mux:
	// mux.Vars(r)[name]).
	// Optional. Default: r.PathValue(name), which ServeMux and chi set.
	PathValue func(r *http.Request, name string) string

	// Kind names the business action, e.g. "image". It matches
	// [a-z0-9][a-z0-9_-]{0,63}; keys of different kinds never collide.
	// Optional. Default: derived from the method and route template,
	// e.g. "post-v1-images".
	Kind string

	// Fingerprint selects the body fields that take part in the parameter
	// fingerprint. With Fields, a key_reused answer also names the fields
	// that changed, when the store keeps their digests.
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

	// Lease is how long a claim lives without renewal; it is renewed
	// every Lease/3 while the handler runs.
	// Optional. Default 30s.
	Lease time.Duration

	// WaitInFlight is how long a request waits for another one holding its
	// key before answering 409 request_in_progress.
	// Optional. Default 0: answer 409 at once.
	WaitInFlight time.Duration

	// MismatchStatus is the status of a key_reused answer, a 4xx.
	// Optional. Default 409.
	MismatchStatus int

	// Cacheable reports whether a response with this status is stored for
	// replay. Others release the claim so that a retry runs the handler.
	// Optional. Default idemgate.DefaultCacheable.
	Cacheable func(status int) bool

	// MaxBodyBytes bounds the request body read for the fingerprint.
	// Optional. Default 1 MiB.
	MaxBodyBytes int64

	// MaxResponseBytes bounds the response body stored for replay.
	// Optional. Default 1 MiB.
	MaxResponseBytes int64

	// ReplayHeaders, when not empty, is the allowlist of response headers
	// stored and replayed.
	// Optional. Default: every header the handler set except hop-by-hop
	// ones, Date, Content-Length and Set-Cookie.
	ReplayHeaders []string

	// FailOpen runs the handler unprotected when the store is unreachable,
	// instead of answering 503 store_unavailable.
	// Optional. Default false.
	FailOpen bool

	// OnEvent receives an Event for each step of each protected request.
	// Optional.
	OnEvent func(ctx context.Context, ev idemgate.Event)

	// ErrorHandler renders the problems the middleware answers in the
	// application's own error format. Before it runs, the answer's
	// headers already say whether to retry (x-should-retry, Retry-After)
	// and that it must not be cached. If it writes nothing, the default
	// answers.
	// Optional. Default: an application/problem+json document (RFC 9457).
	ErrorHandler func(w http.ResponseWriter, r *http.Request, p idemgate.Problem)

	// Logger receives warnings: store errors and lost leases.
	// Optional. Default: no logging.
	Logger *slog.Logger

	// Atomic runs the handler inside the store's transaction (the Store
	// must implement idemgate.TxStore, as pgrecords.Store does), which
	// the handler finds with pgrecords.TxFromContext(r.Context()).
	// Optional. Default false.
	Atomic bool
}

// New returns the idempotency middleware for cfg. It panics with
// "idemgate: …" on a bad config; ToMiddleware returns the error instead.
func New(cfg Config) func(http.Handler) http.Handler {
	mw, err := cfg.ToMiddleware()
	if err != nil {
		panic(err)
	}
	return mw
}

// ToMiddleware validates cfg, applies the defaults to a copy, and returns
// the middleware.
func (cfg Config) ToMiddleware() (func(http.Handler) http.Handler, error) {
	m, err := idemgate.NewEngine(idemgate.EngineConfig{
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
	})
	if cfg.Scope == nil {
		err = errors.Join(err, errors.New("idemgate: Scope is required"))
	}
	if err != nil {
		return nil, err
	}
	s := &shared{cfg: cfg, m: m, names: make(map[string][]string)}
	return func(next http.Handler) http.Handler {
		mux, _ := next.(*http.ServeMux)
		return &handler{shared: s, next: next, mux: mux}
	}, nil
}

// shared is what the handlers of one Config share.
type shared struct {
	cfg   Config
	m     *idemgate.Engine
	mu    sync.RWMutex
	names map[string][]string // ServeMux pattern → its wildcards' names
}

// handler is one protected handler, and its Door.
type handler struct {
	*shared
	next http.Handler
	mux  *http.ServeMux // next, when it is a whole mux
}

var _ idemgate.Door = (*handler)(nil)

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Skipper != nil && h.cfg.Skipper(r) {
		h.next.ServeHTTP(w, r)
		return
	}
	if err := h.m.Serve(w, r, h, nil, nil); err != nil {
		h.fail(w, r, err)
	}
}

// fail answers an error Serve returned, unless the client went away.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	var se scopeError
	switch {
	case errors.As(err, &se):
		http.Error(w, http.StatusText(http.StatusUnauthorized), http.StatusUnauthorized)
	case r.Context().Err() != nil:
		// The client went away: nobody to answer.
	default:
		// A commit the database refused (the handler's failure, marked
		// x-should-retry: false), or a bug.
		if l := h.cfg.Logger; l != nil {
			l.Warn("idemgate: request failed", "err", err)
		}
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
	}
}

// scopeError is Config.Scope's error, told apart from the others Serve
// returns.
type scopeError struct{ err error }

func (e scopeError) Error() string { return e.err.Error() }

func (e scopeError) Unwrap() error { return e.err }

func (h *handler) Route(r *http.Request, _ any) string {
	switch {
	case h.cfg.Route != nil:
		return h.cfg.Route(r)
	case h.mux != nil && r.Pattern == "":
		// Before the mux routes: the pattern it will choose. A request
		// the mux redirects (a trailing slash, a path to clean) has no
		// route yet: the request it is sent to carries the key.
		hd, pattern := h.mux.Handler(r)
		if reflect.TypeOf(hd) == redirectType {
			return ""
		}
		return patternPath(pattern)
	}
	return patternPath(r.Pattern)
}

func (h *handler) Params(r *http.Request, _ any) (names, values []string) {
	template := r.Pattern
	switch {
	case h.cfg.Route != nil:
		template = h.cfg.Route(r)
	case h.mux != nil && r.Pattern == "":
		// The path values are not parsed before the mux routes: the
		// path stands for them, as the engine's own target does.
		return []string{""}, []string{r.URL.EscapedPath()}
	}
	names = h.wildcards(template)
	if len(names) == 0 {
		return nil, nil
	}
	values = make([]string, len(names))
	for i, name := range names {
		if h.cfg.PathValue != nil {
			values[i] = h.cfg.PathValue(r, name)
		} else {
			values[i] = r.PathValue(name)
		}
	}
	return names, values
}

// redirectType is the type of the handler ServeMux.Handler answers for a
// request it redirects.
var redirectType = reflect.TypeOf(http.RedirectHandler("/", http.StatusTemporaryRedirect))

// Matched is false only for an empty template from a whole ServeMux
// (Route asked it): the mux has no route of the request's method for its
// path and answers 404 or 405, or redirects it (or routes it to an
// http.RedirectHandler), so the request passes through. A route's
// handler runs only for a request its router matched; another router
// before routing cannot be asked.
func (h *handler) Matched(_ *http.Request, _ any, template string) bool {
	return template != "" || h.mux == nil || h.cfg.Route != nil
}

func (h *handler) Scope(r *http.Request, _ any) (tenant, user string, err error) {
	tenant, user, err = h.cfg.Scope(r)
	if err != nil {
		return "", "", scopeError{err}
	}
	return tenant, user, nil
}

func (h *handler) Next(w http.ResponseWriter, r *http.Request, _, _ any) error {
	h.next.ServeHTTP(w, r)
	return nil
}

func (h *handler) Problem(w http.ResponseWriter, r *http.Request, _ any, p idemgate.Problem) (bool, error) {
	if h.cfg.ErrorHandler == nil {
		return false, nil
	}
	tw := &trackWriter{ResponseWriter: w}
	h.cfg.ErrorHandler(tw, r, p)
	return tw.wrote, nil
}

// Swap is nil: net/http keeps no response object over the writer, so the
// handler gets the engine's writer itself.
func (*handler) Swap(any, http.ResponseWriter) http.ResponseWriter { return nil }

func (*handler) Rewound(any) {}

func (*handler) Sent(any, int64) {}

// trackWriter tells whether an ErrorHandler answered.
type trackWriter struct {
	http.ResponseWriter
	wrote bool
}

func (w *trackWriter) WriteHeader(code int) {
	w.wrote = true
	w.ResponseWriter.WriteHeader(code)
}

func (w *trackWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

func (w *trackWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// patternPath returns the path part of a ServeMux pattern,
// "[METHOD ][HOST]/[PATH]": its host and path, without the method. An
// empty pattern (no route chosen yet) stays empty.
func patternPath(pattern string) string {
	if i := strings.IndexAny(pattern, " \t"); i >= 0 {
		return strings.TrimLeft(pattern[i:], " \t")
	}
	return pattern
}

// wildcards returns the names of the wildcards of a route template or a
// ServeMux pattern, in order ("{id}", "{rest...}", chi's and gorilla's
// "{id:[0-9]{3}}"; "{$}" is none), parsed once per template.
func (s *shared) wildcards(pattern string) []string {
	s.mu.RLock()
	names, ok := s.names[pattern]
	s.mu.RUnlock()
	if ok {
		return names
	}
	names = parseWildcards(patternPath(pattern))
	s.mu.Lock()
	s.names[pattern] = names // templates are bounded by the router's routes
	s.mu.Unlock()
	return names
}

// parseWildcards returns the names of the {…} wildcards of path: the text
// before a ':' (a regexp follows, whose own braces nest) or a "...".
func parseWildcards(path string) []string {
	var names []string
	for i := 0; i < len(path); i++ {
		if path[i] != '{' {
			continue
		}
		depth, end := 1, -1
		for j := i + 1; j < len(path); j++ {
			switch path[j] {
			case '{':
				depth++
			case '}':
				depth--
			}
			if depth == 0 {
				end = j
				break
			}
		}
		if end < 0 {
			break
		}
		name := path[i+1 : end]
		if k := strings.IndexByte(name, ':'); k >= 0 {
			name = name[:k]
		}
		name = strings.TrimSuffix(strings.TrimSpace(name), "...")
		if name != "$" && name != "" {
			names = append(names, name)
		}
		i = end
	}
	return names
}

// FromRequest returns the idemgate.Request (key and fingerprint) of a
// protected request, for handlers that hand them on to their own store.
// It reports false when the middleware let the request pass through (no
// key, skipped, another method). It is idemgate.RequestFromContext of
// r's context.
func FromRequest(r *http.Request) (idemgate.Request, bool) {
	return idemgate.RequestFromContext(r.Context())
}
