package middleware

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

	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/keyspace"
)

// Request is what the middleware knows about a protected request.
type Request struct {
	// Key is the derived idempotency key (tenant, kind, user, request id).
	Key keyspace.Key
	// Fingerprint covers the method, the route template, the values of its
	// path parameters, the raw query string (exact bytes) and the selected
	// body fields: /v1/orders/1/refund and /v1/orders/2/refund, or the same
	// route with and without ?dry_run=true, never replay each other.
	Fingerprint fingerprint.Fingerprint
}

// FromContext returns the Request of a protected request, for handlers that
// hand the key and fingerprint on to their own store. It reports false when
// the middleware let the request pass through (no key, skipped, other method).
func FromContext(c echo.Context) (Request, bool) {
	st, ok := c.Get(contextKey).(*call)
	if !ok || st == nil {
		return Request{}, false
	}
	return st.req, true
}

const (
	contextKey     = "idemgate.request"
	replayedHeader = "Idempotent-Replayed"
)

// idem is a validated Config with its caches.
type idem struct {
	cfg    Config
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

// call is the state of one protected request, allocated once.
type call struct {
	m     *idem
	rt    *route
	req   Request
	key   string // req.Key.String()
	token Token
	start time.Time
	ctx   detached        // the request's context without its cancellation
	sc    storeContext    // the first storeCtx
	sctx  context.Context // storeCtx
	body  bodyReader
	cw    captureWriter
	sums  [8]fingerprint.FieldSum // backs the claim's Fields for up to 8 pointers

	renewMu   sync.Mutex
	renewer   *time.Timer
	renewDone bool
	leaseLost atomic.Bool
}

func (m *idem) serve(c echo.Context, next echo.HandlerFunc) error {
	if m.cfg.Skipper(c) {
		return next(c)
	}
	r := c.Request()
	if !m.protects(r.Method) {
		return m.passThrough(c, next)
	}
	rt := m.route(c)
	if rt == nil {
		return next(c) // echo's 404 or 405: no key to claim
	}
	values := r.Header[m.header]
	if len(values) == 0 {
		if m.cfg.Required {
			return m.problem(c, http.StatusBadRequest, CodeKeyMissing,
				"This request needs an "+m.cfg.Header+" header.", 0)
		}
		return m.passThrough(c, next)
	}
	if len(values) > 1 {
		return m.problem(c, http.StatusBadRequest, CodeKeyInvalid,
			"The "+m.cfg.Header+" header must appear once.", 0)
	}
	id, ok := parseKey(values[0])
	if !ok {
		return m.problem(c, http.StatusBadRequest, CodeKeyInvalid,
			"The "+m.cfg.Header+" header must be 1 to 255 bytes of visible ASCII, or a quoted string.", 0)
	}
	tenant, user, err := m.cfg.Scope(c)
	if err != nil {
		return err
	}
	st := &call{m: m, rt: rt, start: m.now()}
	st.ctx.parent = r.Context()
	st.req.Key, err = keyspace.Derive(st.rt.kind, keyspace.Scope{Tenant: tenant, User: user, Request: id})
	if err != nil {
		if detail := scopeRefusal(tenant, user); detail != "" {
			st.warn("idemgate: the credentials' identity cannot scope an idempotency key", "scope", errors.New(detail))
			return m.problem(c, http.StatusBadRequest, CodeScopeInvalid,
				"The "+detail+"; an idempotency key takes 1 to 255 bytes of each. Retrying will not help.", 0)
		}
		// The kind is valid (checked by New, or KindFor's) and the
		// request id passed parseKey: a bug.
		return echo.NewHTTPError(http.StatusInternalServerError).SetInternal(fmt.Errorf("idemgate: derive key: %w", err))
	}
	st.key = st.req.Key.String()

	body, err := readBody(r, m.cfg.MaxBodyBytes)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.Is(err, errBodyTooLarge) || errors.As(err, &tooLarge) {
			return m.problem(c, http.StatusRequestEntityTooLarge, CodeBodyTooLarge,
				"The request body is larger than this endpoint accepts.", 0)
		}
		if timedOut(err) {
			return m.problem(c, http.StatusRequestTimeout, CodeBodyTimeout,
				"The request body did not arrive in time; retry.", 1)
		}
		return m.problem(c, http.StatusBadRequest, CodeBodyInvalid, "The request body could not be read.", 0)
	}
	st.body.Reset(body)
	r.Body = &st.body
	inner, fields, err := m.fp.SumRequestFields(r, body, st.sums[:0])
	if err != nil {
		return m.problem(c, http.StatusBadRequest, CodeBodyInvalid, err.Error(), 0)
	}
	names, values := c.ParamNames(), c.ParamValues()
	if c.Path() == "" {
		// Before routing (e.Pre): no route template and no path
		// parameters, so the path itself is the request target.
		names, values = []string{""}, []string{r.URL.EscapedPath()}
	}
	st.req.Fingerprint = st.rt.target.Sum(names, values, r.URL.RawQuery, inner)

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
		stored storedResponse // a finished response the Redis store did not decode
	)
	if rs, ok := m.cfg.Store.(storedClaimer); ok {
		res, stored, err = rs.ClaimStored(st.storeCtx(), st.key, claim)
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
		return st.storeDown(c, next, err)
	}
	switch res.Status {
	case Claimed:
		st.emit(Event{Type: EventClaimed})
		if m.tx != nil {
			return st.runAtomic(c, next)
		}
		return st.run(c, next)
	case Finished:
		if stored.Status() != 0 {
			return st.replayStored(c, &stored)
		}
		return st.replay(c, res.Response)
	case Running:
		st.emit(Event{Type: EventInProgress, Status: http.StatusConflict})
		return m.problem(c, http.StatusConflict, CodeRequestInProgress,
			"A request with this idempotency key is still running; retry later.", m.inProgressRetry(res.RetryAfter))
	case Mismatch:
		st.emit(Event{Type: EventReused, Status: m.cfg.MismatchStatus})
		return m.reused(c, m.changed(res.Changed, len(fields)))
	}
	return st.storeDown(c, next, errors.New("idemgate: store answered an unknown claim status "+res.Status.String()))
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
func (m *idem) inProgressRetry(left time.Duration) int {
	return retrySeconds(min(left, m.cfg.Lease/3))
}

func (m *idem) protects(method string) bool {
	for _, x := range m.cfg.Methods {
		if x == method {
			return true
		}
	}
	return false
}

// reused answers key_reused, with the pointers of the fields that changed
// if the store could tell (names only, never values).
func (m *idem) reused(c echo.Context, changed []string) error {
	return m.answer(c, Problem{Status: m.cfg.MismatchStatus, Code: CodeKeyReused, Title: problemTitles[CodeKeyReused],
		Detail: "This idempotency key was already used with other request parameters. Send a new key for new parameters.", Changed: changed})
}

// changed maps a store's Changed indexes to the configured pointers; nil
// unless the claim carried one digest per pointer.
func (m *idem) changed(idx []int, sums int) []string {
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

// run runs the handler under the claim, then stores or releases it.
func (st *call) run(c echo.Context, next echo.HandlerFunc) (err error) {
	// Only a handler reads the request (FromContext): a replay or a
	// conflict saves echo's context map.
	c.Set(contextKey, st)
	m := st.m
	res := c.Response()
	orig := res.Writer
	st.cw.reset(orig, m.filter, m.cfg.MaxResponseBytes)
	res.Writer = &st.cw
	st.startRenewal()

	finished := false
	defer func() {
		if finished {
			return
		}
		// The handler panicked (or called runtime.Goexit): release the
		// claim so a retry can run, then panic on.
		st.stopRenewal()
		res.Writer = orig
		st.cw.release()
		st.release("panic", 0)
		if p := recover(); p != nil {
			panic(p)
		}
	}()
	err = next(c)
	// The capture writer, not res.Committed, knows whether a status went
	// out: a handler that only flushed wrote one through it.
	if err == nil && !st.cw.wroteHeader && !st.cw.hijacked {
		// What net/http would send: 200 with the headers set so far.
		res.WriteHeader(http.StatusOK)
	}
	finished = true
	st.stopRenewal()
	res.Writer = orig
	defer st.cw.release()

	switch {
	case err != nil:
		st.release("handler_error", 0)
		if errors.Is(err, ErrKeyReused) {
			st.emit(Event{Type: EventReused, Status: m.cfg.MismatchStatus})
			if !st.cw.wroteHeader && !st.cw.hijacked {
				return m.reused(c, nil)
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
	case plant == "release-on-client-gone" && (st.cw.clientErr != nil || c.Request().Context().Err() != nil):
		st.release("planted", st.cw.status) // the client left: its complete answer is thrown away
	default:
		st.complete()
	}
	return nil
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

func (st *call) storeDown(c echo.Context, next echo.HandlerFunc, err error) error {
	st.emit(Event{Type: EventStoreError, Reason: "claim", Err: err})
	st.warn("idemgate: store unavailable", "claim", err)
	st.releaseUnconfirmed()
	if st.m.cfg.FailOpen {
		st.emit(Event{Type: EventFailOpen, Err: err})
		c.Set(contextKey, st)
		return next(c)
	}
	return st.m.problem(c, http.StatusServiceUnavailable, CodeStoreUnavailable,
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
