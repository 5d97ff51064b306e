package otelidem

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgate/idemgate"
)

// scope is the instrumentation scope of every instrument and span: the
// module's path, shared with otelpgstore, so that both packages' metrics
// sit under one scope.
const scope = "github.com/idemgate/idemgate/otelidem"

// Attribute keys. Their values come from small fixed sets (or, for
// routes and kinds, from the application's code), so a series count never
// grows with traffic.
const (
	keyOutcome    = attribute.Key("idemgate.outcome")
	keyKind       = attribute.Key("idemgate.kind")
	keyTenant     = attribute.Key("idemgate.tenant")
	keyReason     = attribute.Key("idemgate.reason")
	keyOperation  = attribute.Key("idemgate.operation")
	keyResult     = attribute.Key("idemgate.result")
	keyWaitResult = attribute.Key("idemgate.wait.result")
	keyMethod     = attribute.Key("http.request.method")
	keyRoute      = attribute.Key("http.route")
	keyStatus     = attribute.Key("http.response.status_code")
)

// durationBuckets suit calls that take from a fraction of a millisecond
// (a Redis round trip) to seconds (a slow store, a long wait).
var durationBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
	0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// Config configures a Recorder.
type Config struct {
	// MeterProvider makes the instruments. Optional. Default
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider makes the spans. Optional. Default
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator reads a caller's trace context from the request headers
	// (Server). Optional. Default propagation.TraceContext{}.
	Propagator propagation.TextMapPropagator
	// Tenant adds the normalized tenant as the attribute idemgate.tenant
	// to the request metrics. Optional. Default false: a service with
	// many tenants would get a series per tenant.
	Tenant bool
}

// Recorder turns the middleware's events and store calls into instruments
// and spans. Its methods are safe for concurrent use.
type Recorder struct {
	cfg    Config
	tracer trace.Tracer

	requests  metric.Int64Counter
	decision  metric.Float64Histogram
	storeDur  metric.Float64Histogram
	waitDur   metric.Float64Histogram
	eventSets sync.Map // eventKey → metric.MeasurementOption
}

// New returns a Recorder whose instruments are registered with cfg's
// meter provider.
func New(cfg Config) (*Recorder, error) {
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = otel.GetMeterProvider()
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	if cfg.Propagator == nil {
		cfg.Propagator = propagation.TraceContext{}
	}
	m := cfg.MeterProvider.Meter(scope)
	r := &Recorder{cfg: cfg, tracer: cfg.TracerProvider.Tracer(scope)}
	var err, e error
	r.requests, e = m.Int64Counter("idemgate.requests", metric.WithUnit("{request}"),
		metric.WithDescription("Requests with an idempotency key, by what the middleware did (idemgate.outcome). "+
			"released, lease_lost and store_error follow a claimed request."))
	err = errors.Join(err, e)
	r.decision, e = m.Float64Histogram("idemgate.decision.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from the middleware's start to its decision: reading and fingerprinting the body and the claim."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	err = errors.Join(err, e)
	r.storeDur, e = m.Float64Histogram("idemgate.store.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of the middleware's store calls (claim, extend, complete, release; begin, commit, rollback of an Atomic route)."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	err = errors.Join(err, e)
	r.waitDur, e = m.Float64Histogram("idemgate.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("Time a request waited for an in-flight request holding its key."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	err = errors.Join(err, e)
	if err != nil {
		return nil, fmt.Errorf("otelidem: instruments: %w", err)
	}
	return r, nil
}

// OnEvent records a middleware event. Set it as middleware.Config.OnEvent
// or idemgate.Runner.OnEvent (or call it from yours). A Runner.Do event,
// whose Route is empty, is recorded without http.request.method and
// http.route. It records with ctx, the request's context, so
// that an SDK with exemplars links a measurement to the request's trace.
func (r *Recorder) OnEvent(ctx context.Context, ev idemgate.Event) {
	set := r.eventSet(ev)
	switch ev.Type {
	case idemgate.EventWaited:
		r.waitDur.Record(ctx, ev.Latency.Seconds(), set)
	case idemgate.EventClaimed, idemgate.EventReplayed, idemgate.EventReused, idemgate.EventInProgress:
		r.decision.Record(ctx, ev.Latency.Seconds(), set)
		r.requests.Add(ctx, 1, set)
	default:
		r.requests.Add(ctx, 1, set)
	}
}

// eventKey is what an event's attributes depend on.
type eventKey struct {
	typ                         idemgate.EventType
	route, kind, tenant, reason string
}

// eventSet returns the attributes of ev, built once per distinct set: the
// sets are as few as the series they make.
func (r *Recorder) eventSet(ev idemgate.Event) metric.MeasurementOption {
	k := eventKey{typ: ev.Type, route: ev.Route, kind: ev.Kind}
	if r.cfg.Tenant {
		k.tenant = ev.Tenant
	}
	switch ev.Type {
	case idemgate.EventWaited, idemgate.EventReleased, idemgate.EventLeaseLost, idemgate.EventStoreError:
		k.reason = ev.Reason
	}
	if o, ok := r.eventSets.Load(k); ok {
		return o.(metric.MeasurementOption)
	}
	attrs := make([]attribute.KeyValue, 0, 6)
	// An event with no route is Runner.Do's: no HTTP attributes.
	if k.route != "" {
		method, route, ok := strings.Cut(k.route, " ")
		if !ok {
			method, route = "_OTHER", k.route
		}
		attrs = append(attrs, keyMethod.String(method), keyRoute.String(route))
	}
	attrs = append(attrs, keyKind.String(k.kind))
	if k.tenant != "" {
		attrs = append(attrs, keyTenant.String(k.tenant))
	}
	if k.typ == idemgate.EventWaited {
		attrs = append(attrs, keyWaitResult.String(k.reason))
	} else {
		attrs = append(attrs, keyOutcome.String(k.typ.String()))
		if k.reason != "" {
			attrs = append(attrs, keyReason.String(k.reason))
		}
	}
	o, _ := r.eventSets.LoadOrStore(k, metric.WithAttributeSet(attribute.NewSet(attrs...)))
	return o.(metric.MeasurementOption)
}
