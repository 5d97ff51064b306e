// Package otelidem reports what idemgate's middleware does as
// OpenTelemetry metrics and spans: its events (what it decided for each
// request), the time its store calls add to a request, and a server span
// per request that the store calls are children of.
//
// It uses only the OpenTelemetry API and imports neither pgstore nor pgx:
// a service that uses only the middleware pulls in nothing more. The
// application chooses the SDK and exporters (Prometheus, OTLP, stdout)
// and passes its providers in Config; without them the global providers
// are used, which do nothing until the application installs an SDK.
// pgstore's tasks and workers have their own package, otelpgstore, in this
// module; both report under the instrumentation scope
// github.com/idemgate/idemgate/otelidem.
//
// Wiring (idem is github.com/idemgate/idemgate/middleware):
//
//	rec, err := otelidem.New(otelidem.Config{MeterProvider: mp, TracerProvider: tp})
//	e.Use(rec.Server())                               // a span per request
//	store := rec.Store(redisstore.New(rdb))       // spans and durations of store calls
//	e.Use(idem.New(idem.Config{Store: store, OnEvent: rec.OnEvent, ...}))
//
// Attributes are bounded: route, method, kind, outcome, operation and
// result; the tenant only with Config.Tenant. A raw idempotency key, a
// user id or a body never becomes an attribute, and a store's error is
// recorded on its span with the key replaced by "[key]".
//
// Instruments (OpenTelemetry name; Prometheus name through the Prometheus
// exporter):
//
//	idemgate.requests           idemgate_requests_total            {request} by idemgate.outcome, http.request.method, http.route, idemgate.kind
//	idemgate.decision.duration  idemgate_decision_duration_seconds s: from the middleware's start to its decision (claim, replay, conflict)
//	idemgate.store.duration     idemgate_store_duration_seconds    s: each store call (and an Atomic route's begin, commit, rollback), by idemgate.operation and idemgate.result
//	idemgate.wait.duration      idemgate_wait_duration_seconds     s: waits for an in-flight duplicate, by idemgate.wait.result
//
// A Runner.Do event has no route: its points carry no http.request.method
// and no http.route.
//
// Spans: the server span "METHOD /route" (Server), and idemgate.claim,
// idemgate.extend, idemgate.complete and idemgate.release (Store), with
// idemgate.begin, idemgate.commit and idemgate.rollback when the store is
// a idemgate.TxStore (an Atomic route's transaction).
package otelidem
