package idemgate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/wire"
	"github.com/idemgate/idemgate/keyspace"
)

// Request is what the engine knows about a protected request.
type Request struct {
	// Key is the derived idempotency key (tenant, kind, user, request id).
	Key keyspace.Key
	// Fingerprint covers the method, the route template, the values of its
	// path parameters, the raw query string (exact bytes) and the selected
	// body fields: /v1/orders/1/refund and /v1/orders/2/refund, or the same
	// route with and without ?dry_run=true, never replay each other.
	Fingerprint fingerprint.Fingerprint
}

// requestKey is the context key of a protected request's Request.
type requestKey struct{}

// RequestFromContext returns the Request of a protected request from the
// context of the request its handler got, for handlers that hand the key
// and fingerprint on to their own store. It reports false when the engine
// let the request pass through (no key, skipped, another method).
func RequestFromContext(ctx context.Context) (Request, bool) {
	st, ok := ctx.Value(requestKey{}).(*call)
	if !ok || st == nil {
		return Request{}, false
	}
	return st.req, true
}

const replayedHeader = "Idempotent-Replayed"

// A Door is one framework's side of an Engine: an adapter makes one per
// configuration (or per protected handler) and passes it to Engine.Serve
// with its own values for the request: x (echo's Context; nil for
// net/http) and next (the handler to run; nil when the Door holds it),
// which the Engine hands back to the Door's methods as they are. A Door
// translates and holds no rule of idempotency.
type Door interface {
	// Route returns the route template the router chose for r. An empty
	// template means that routing has not happened yet (the adapter runs
	// before the router): the path itself is then the request's target.
	Route(r *http.Request, x any) (template string)

	// Params returns the names and values of the path parameters of r's
	// route, for its fingerprint; the Engine does not keep them.
	Params(r *http.Request, x any) (names, values []string)

	// Matched reports whether the router runs a handler of r's method for
	// template, rather than its own 404 or 405: a request it answers so
	// passes through with no key claimed and no body read. The Engine asks
	// once per new template, and for every request whose template is
	// empty.
	Matched(r *http.Request, x any, template string) bool

	// Scope returns the tenant and user that scope the request's key. An
	// error goes back to the adapter from Serve as it is.
	Scope(r *http.Request, x any) (tenant, user string, err error)

	// Next runs the protected handler, next, with w and r in place of
	// the request's own. r's context carries the Request
	// (RequestFromContext) and, on an Atomic route, the transaction.
	Next(w http.ResponseWriter, r *http.Request, x, next any) error

	// Problem renders p in the application's own error format, if it has
	// one. The answer's headers already say whether to retry and that it
	// must not be cached. It reports whether it answered (or failed to);
	// when it did not, the Engine writes p as application/problem+json.
	Problem(w http.ResponseWriter, r *http.Request, x any, p Problem) (answered bool, err error)

	// Swap is for a framework that keeps a response object of its own
	// over the writer (echo's *echo.Response, whose bookkeeping the
	// handler's writes must pass through): it puts w beneath that object
	// and returns the writer it replaced. An adapter without one returns
	// nil, and the Engine hands the handler its writer directly.
	Swap(x any, w http.ResponseWriter) http.ResponseWriter

	// Rewound tells the framework's response object that the Engine took
	// back a held answer (an Atomic route that rolled back): nothing has
	// been sent. Sent tells it that the held answer went out, n bytes of
	// body. Adapters without a response object do nothing.
	Rewound(x any)
	Sent(x any, n int64)
}

// Engine is the state machine behind every HTTP door: it claims a
// request's key, runs the handler once under a renewed lease (in a
// transaction of the store's on an Atomic route), completes or releases
// the claim, replays a finished answer, waits for one in flight, and
// answers the problems in between. An Engine is safe for concurrent use.
type Engine struct {
	cfg    EngineConfig
	now    func() time.Time
	tx     TxStore // set on an Atomic route
	header string  // canonical
	filter *headerFilter
	fp     *fingerprint.Compiled // cfg.Fingerprint, compiled once

	last   atomic.Pointer[route] // per-route use: always the same route
	epoch  atomic.Pointer[epoch] // storeEpoch
	mu     sync.Mutex
	routes map[routeKey]*route
}

// storedClaimer is a Store that can answer a finished record without
// decoding it (the Redis store): its replay is written from the stored
// bytes.
type storedClaimer interface {
	ClaimStored(ctx context.Context, key string, req ClaimRequest) (ClaimResult, wire.Stored, error)
}

// call is the state of one protected request, allocated once.
type call struct {
	m     *Engine
	rt    *route
	d     Door
	x     any
	next  any
	req   Request
	key   string // req.Key.String()
	token Token
	start time.Time
	ctx   detached        // the request's context without its cancellation
	rctx  requestContext  // the handler's context: the request's, with req
	sc    storeContext    // the first storeCtx
	sctx  context.Context // storeCtx
	body  bodyReader
	cw    captureWriter
	sums  [8]fingerprint.FieldSum // backs the claim's Fields for up to 8 pointers

	renewMu   sync.Mutex
	renewer   *time.Timer
	renewDone bool
	leaseLost atomic.Bool
	lost      context.CancelCauseFunc // Runner.Do's: cancels fn's context
}

// requestContext is the handler's context: the request's, whose Value
// answers the Request too. It lives inside call, so it costs no
// allocation.
type requestContext struct {
	context.Context
	st *call
}

func (c *requestContext) Value(key any) any {
	if key == (requestKey{}) {
		return c.st
	}
	return c.Context.Value(key)
}

// withRequest returns r with a context that carries the call's Request.
func (st *call) withRequest(r *http.Request) *http.Request {
	st.rctx = requestContext{Context: r.Context(), st: st}
	return r.WithContext(&st.rctx)
}

// Serve runs one request through the engine on behalf of door d (see
// Door), writing its answer to w. It returns the errors the adapter's
// framework answers: the handler's own, the Scope's, and an error when
// the client went away before an answer was due. It costs an adapter no
// allocation: x and next are the adapter's values (a pointer or a func),
// which an interface holds as they are.
func (m *Engine) Serve(w http.ResponseWriter, r *http.Request, d Door, x, next any) error {
	if !m.protects(r.Method) {
		return m.passThrough(w, r, d, x, next)
	}
	rt, template := m.route(r, d, x)
	if rt == nil {
		return d.Next(w, r, x, next) // the router's 404 or 405: no key to claim
	}
	values := r.Header[m.header]
	if len(values) == 0 {
		if m.cfg.Required {
			return m.problem(w, r, d, x, http.StatusBadRequest, CodeKeyMissing,
				"This request needs an "+m.cfg.Header+" header.", 0)
		}
		return m.passThrough(w, r, d, x, next)
	}
	if len(values) > 1 {
		return m.problem(w, r, d, x, http.StatusBadRequest, CodeKeyInvalid,
			"The "+m.cfg.Header+" header must appear once.", 0)
	}
	id, ok := parseKey(values[0])
	if !ok {
		return m.problem(w, r, d, x, http.StatusBadRequest, CodeKeyInvalid,
			"The "+m.cfg.Header+" header must be 1 to 255 bytes of visible ASCII, or a quoted string.", 0)
	}
	tenant, user, err := d.Scope(r, x)
	if err != nil {
		return err
	}
	st := &call{m: m, rt: rt, d: d, x: x, next: next, start: m.now()}
	st.ctx.parent = r.Context()
	st.req.Key, err = keyspace.Derive(st.rt.kind, keyspace.Scope{Tenant: tenant, User: user, Request: id})
	if err != nil {
		if detail := scopeRefusal(tenant, user); detail != "" {
			st.warn("idemgate: the credentials' identity cannot scope an idempotency key", "scope", errors.New(detail))
			return m.problem(w, r, d, x, http.StatusBadRequest, CodeScopeInvalid,
				"The "+detail+"; an idempotency key takes 1 to 255 bytes of each. Retrying will not help.", 0)
		}
		// The kind is valid (checked by NewEngine, or KindFor's) and the
		// request id passed parseKey: a bug.
		return fmt.Errorf("idemgate: derive key: %w", err)
	}
	st.key = st.req.Key.String()

	body, err := readBody(r, m.cfg.MaxBodyBytes)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.Is(err, errBodyTooLarge) || errors.As(err, &tooLarge) {
			return m.problem(w, r, d, x, http.StatusRequestEntityTooLarge, CodeBodyTooLarge,
				"The request body is larger than this endpoint accepts.", 0)
		}
		if timedOut(err) {
			return m.problem(w, r, d, x, http.StatusRequestTimeout, CodeBodyTimeout,
				"The request body did not arrive in time; retry.", 1)
		}
		return m.problem(w, r, d, x, http.StatusBadRequest, CodeBodyInvalid, "The request body could not be read.", 0)
	}
	st.body.Reset(body)
	r.Body = &st.body
	inner, fields, err := m.fp.SumRequestFields(r, body, st.sums[:0])
	if err != nil {
		return m.problem(w, r, d, x, http.StatusBadRequest, CodeBodyInvalid, err.Error(), 0)
	}
	var names, pvalues []string
	if template == "" {
		// Before routing: no route template and no path parameters, so
		// the path itself is the request target.
		names, pvalues = []string{""}, []string{r.URL.EscapedPath()}
	} else {
		names, pvalues = d.Params(r, x)
	}
	st.req.Fingerprint = st.rt.target.Sum(names, pvalues, r.URL.RawQuery, inner)

	st.token = newClaimToken(m.now(), m.cfg.Lease)
	claim := ClaimRequest{
		Fingerprint: st.req.Fingerprint,
		Owner:       st.req.Key.Owner(),
		Kind:        st.req.Key.Kind(),
		Lease:       m.cfg.Lease,
		Token:       st.token,
		Fields:      fields,
	}
	if plant == "replay-ignores-fingerprint" {
		claim.Fingerprint = "planted" // every record matches every body
	}
	// The claim runs detached from the client (storeCtx): a claim the
	// store executed must not be abandoned half-way, or it would block the
	// client's own retry for a whole lease.
	var (
		res    ClaimResult
		stored wire.Stored // a finished response the store did not decode
	)
	if sc, ok := m.cfg.Store.(storedClaimer); ok {
		res, stored, err = sc.ClaimStored(st.storeCtx(), st.key, claim)
	} else {
		res, err = m.cfg.Store.Claim(st.storeCtx(), st.key, claim)
	}
	if err == nil && res.Status == Running && m.cfg.WaitInFlight > 0 {
		res, err = st.wait(r.Context(), claim, res)
	}
	if cerr := r.Context().Err(); cerr != nil {
		// The client went away: no store outage, and nobody to answer.
		// Give a fresh claim back so that its retry runs at once.
		switch {
		case err != nil:
			st.releaseUnconfirmed()
		case res.Status == Claimed:
			st.release("canceled", 0)
		}
		return fmt.Errorf("idemgate: the client went away: %w", cerr)
	}
	if err != nil {
		return st.storeDown(w, r, err)
	}
	switch res.Status {
	case Claimed:
		st.emit(Event{Type: EventClaimed})
		return st.run(w, r)
	case Finished:
		if stored.Status() != 0 {
			return st.replayStored(w, r, &stored)
		}
		return st.replay(w, r, res.Response)
	case Running:
		st.emit(Event{Type: EventInProgress, Status: http.StatusConflict})
		return m.problem(w, r, d, x, http.StatusConflict, CodeRequestInProgress,
			"A request with this idempotency key is still running; retry later.", m.inProgressRetry(res.RetryAfter))
	case Mismatch:
		st.emit(Event{Type: EventReused, Status: m.cfg.MismatchStatus})
		return m.reused(w, r, d, x, m.changed(res.Changed, len(fields)))
	}
	return st.storeDown(w, r, errors.New("idemgate: store answered an unknown claim status "+res.Status.String()))
}

// scopeRefusal says which part of the identity keyspace refuses, by its
// length only, or "" if neither: "user identity is 312 bytes". A long JWT
// sub is the usual cause; it is the client's own identity, but logs and
// answers never carry it.
func scopeRefusal(tenant, user string) string {
	for _, p := range [...]struct {
		what string
		v    string
		max  int
	}{{"tenant", tenant, keyspace.MaxTenant}, {"user identity", user, keyspace.MaxUser}} {
		switch {
		case p.v == "":
			return p.what + " is empty"
		case len(p.v) > p.max:
			return p.what + " is " + strconv.Itoa(len(p.v)) + " bytes"
		}
	}
	return ""
}

// inProgressRetry is the Retry-After of request_in_progress: the time left
// on the holder's lease, but at most Lease/3 (and at least 1 s). Most
// handlers finish long before their lease runs out, and clients honour
// Retry-After: a full lease would make a retry wait ~30 s for a result
// that was ready in milliseconds.
func (m *Engine) inProgressRetry(left time.Duration) int {
	return retrySeconds(min(left, m.cfg.Lease/3))
}

func (m *Engine) protects(method string) bool {
	for _, x := range m.cfg.Methods {
		if x == method {
			return true
		}
	}
	return false
}

// reused answers key_reused, with the pointers of the fields that changed
// if the store could tell (names only, never values).
func (m *Engine) reused(w http.ResponseWriter, r *http.Request, d Door, x any, changed []string) error {
	return m.answer(w, r, d, x, Problem{Status: m.cfg.MismatchStatus, Code: CodeKeyReused, Title: problemTitles[CodeKeyReused],
		Detail: "This idempotency key was already used with other request parameters. Send a new key for new parameters.", Changed: changed})
}

// changed maps a store's Changed indexes to the configured pointers; nil
// unless the claim carried one digest per pointer.
func (m *Engine) changed(idx []int, sums int) []string {
	fields := m.cfg.Fingerprint.Fields
	if len(idx) == 0 || sums != len(fields) {
		return nil
	}
	out := make([]string, 0, len(idx))
	for _, i := range idx {
		if i >= 0 && i < len(fields) && !slices.Contains(out, fields[i]) {
			out = append(out, fields[i])
		}
	}
	return out
}

// run runs the handler under the claim, then stores or releases it; on
// an Atomic route, in the store's transaction (runAtomic).
func (st *call) run(w http.ResponseWriter, r *http.Request) (err error) {
	if st.m.tx != nil {
		return st.runAtomic(w, r)
	}
	m, d, x := st.m, st.d, st.x
	// Only a handler reads the request (RequestFromContext): a replay or
	// a conflict saves its context.
	r = st.withRequest(r)
	front, inner := st.capture(w)
	st.startRenewal()

	finished := false
	defer func() {
		if finished {
			return
		}
		// The handler panicked (or called runtime.Goexit): release the
		// claim so a retry can run, then panic on.
		st.stopRenewal()
		d.Swap(x, inner)
		st.cw.release()
		st.release("panic", 0)
		if p := recover(); p != nil {
			panic(p)
		}
	}()
	err = d.Next(front, r, x, st.next)
	// The capture writer, not the framework, knows whether a status went
	// out: a handler that only flushed wrote one through it.
	if err == nil && !st.cw.wroteHeader && !st.cw.hijacked {
		// What net/http would send: 200 with the headers set so far.
		front.WriteHeader(http.StatusOK)
	}
	finished = true
	st.stopRenewal()
	d.Swap(x, inner)
	defer st.cw.release()

	switch {
	case err != nil:
		st.release("handler_error", 0)
		if errors.Is(err, ErrKeyReused) {
			st.emit(Event{Type: EventReused, Status: m.cfg.MismatchStatus})
			if !st.cw.wroteHeader && !st.cw.hijacked {
				return m.reused(w, r, d, x, nil)
			}
			return nil
		}
		return err
	case st.cw.hijacked:
		st.release("hijacked", 0)
	case st.cw.overflow:
		st.release("response_too_large", st.cw.status)
	case !m.cfg.Cacheable(st.cw.status):
		st.release("not_cacheable", st.cw.status)
	case plant == "release-on-client-gone" && (st.cw.clientErr != nil || r.Context().Err() != nil):
		st.release("planted", st.cw.status) // the client left: its complete answer is thrown away
	default:
		st.complete()
	}
	return nil
}

// capture puts the capture writer in the handler's way: beneath the
// framework's response object if it keeps one (front is then w), or
// handed to the handler itself. inner is the writer it wraps, which
// Swap puts back.
func (st *call) capture(w http.ResponseWriter) (front, inner http.ResponseWriter) {
	inner = st.d.Swap(st.x, &st.cw)
	front = w
	if inner == nil {
		inner, front = w, &st.cw
	}
	st.cw.reset(inner, st.m.filter, st.m.cfg.MaxResponseBytes)
	return front, inner
}

func (st *call) complete() {
	ctx := st.storeCtx()
	resp := Response{Status: st.cw.status, Header: st.cw.header, Body: *st.cw.body}
	err := st.m.cfg.Store.Complete(ctx, st.key, st.token, resp, st.m.cfg.Retention)
	if err != nil {
		st.storeFailed(&st.ctx, "complete", err)
	}
}

func (st *call) release(reason string, status int) {
	ctx := st.storeCtx()
	err := st.m.cfg.Store.Release(ctx, st.key, st.token)
	if err != nil {
		st.storeFailed(&st.ctx, "release", err)
		return
	}
	st.emit(Event{Type: EventReleased, Reason: reason, Status: status})
}

// storeFailed reports a failed extend, complete, release or commit with
// ctx: the request's, or the lease renewal's own.
func (st *call) storeFailed(ctx context.Context, op string, err error) {
	if errors.Is(err, ErrLeaseLost) {
		if st.lost != nil {
			st.lost(ErrLeaseLost)
		}
		if st.leaseLost.Swap(true) && op == "extend" {
			return
		}
		st.emitCtx(ctx, Event{Type: EventLeaseLost, Reason: op})
		st.warn("idemgate: lease lost; the key may run again", op, nil)
		return
	}
	st.emitCtx(ctx, Event{Type: EventStoreError, Reason: op, Err: err})
	st.warn("idemgate: store error", op, err)
}

func (st *call) storeDown(w http.ResponseWriter, r *http.Request, err error) error {
	st.emit(Event{Type: EventStoreError, Reason: "claim", Err: err})
	st.warn("idemgate: store unavailable", "claim", err)
	st.releaseUnconfirmed()
	if st.m.cfg.FailOpen {
		st.emit(Event{Type: EventFailOpen, Err: err})
		return st.d.Next(w, st.withRequest(r), st.x, st.next)
	}
	return st.m.problem(w, r, st.d, st.x, http.StatusServiceUnavailable, CodeStoreUnavailable,
		"The idempotency store is unavailable; retry later.", 1)
}

// emit reports e with the request's context: its values (a trace span,
// a request-scoped logger) without its cancellation, so that an event
// after the client left is still reported.
func (st *call) emit(e Event) { st.emitCtx(&st.ctx, e) }

// emitCtx reports e with ctx, for the events of a store call made on a
// context of its own (the lease renewal).
func (st *call) emitCtx(ctx context.Context, e Event) {
	if st.m.cfg.OnEvent == nil {
		return
	}
	e.Route = st.rt.name
	e.Kind = st.rt.kind
	e.Tenant = st.req.Key.Tenant()
	e.Latency = st.m.now().Sub(st.start)
	// A hook is for metrics and logs: its panic must not unwind the
	// request path between a claim and its completion, which would leave
	// the key claimed for a whole lease.
	defer func() {
		if p := recover(); p != nil {
			st.m.cfg.Logger.Error("idemgate: OnEvent panicked", "event", e.Type.String(), "panic", fmt.Sprint(p))
		}
	}()
	st.m.cfg.OnEvent(ctx, e)
}

func (st *call) warn(msg, op string, err error) {
	l := st.m.cfg.Logger
	if !l.Enabled(context.Background(), slog.LevelWarn) {
		return
	}
	attrs := []any{"op", op, "route", st.rt.name, "kind", st.rt.kind, "tenant", st.req.Key.Tenant()}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	l.Warn(msg, attrs...)
}
