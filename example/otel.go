package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/otelidem"
	"github.com/idemgate/idemgate/otelidem/otelpgstore"
	"github.com/idemgate/idemgate/pgstore"
)

// obsSettings are the observability settings of serve and worker.
type obsSettings struct {
	adminAddr     string // the admin listener (/metrics); "off" or "" disables it
	adminExplicit bool   // set by flag or ADMIN_ADDR: a busy port is then an error
	traces        string // OTEL_TRACES_EXPORTER, or "otlp" when an OTLP endpoint is set
	tenantMetrics bool   // OTEL_METRICS_TENANT=true: the tenant as a metric attribute
	stdout        io.Writer
}

// defaultAdminAddr serves /metrics on loopback only: metrics say how busy
// each route is, which is not for the internet.
const defaultAdminAddr = "localhost:9464"

// addObsFlags registers -admin-addr and reads the OTel environment.
func (s *obsSettings) addObsFlags(fs *flag.FlagSet, getenv func(string) string, stdout io.Writer) {
	addr := getenv("ADMIN_ADDR")
	s.adminExplicit = addr != ""
	if addr == "" {
		addr = defaultAdminAddr
	}
	fs.Func("admin-addr", "admin listener for /metrics (env ADMIN_ADDR; \"off\" disables; default "+defaultAdminAddr+")",
		func(v string) error {
			s.adminAddr, s.adminExplicit = v, true
			return nil
		})
	s.adminAddr = addr
	s.traces = strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")))
	if s.traces == "" && (getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "") {
		s.traces = "otlp"
	}
	if p := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"); p != "" {
		s.traces += "+" + p
	} else if p := getenv("OTEL_EXPORTER_OTLP_PROTOCOL"); p != "" {
		s.traces += "+" + p
	}
	s.tenantMetrics = getenv("OTEL_METRICS_TENANT") == "true"
	s.stdout = stdout
}

// observer is the process's OpenTelemetry SDK: metrics through the
// Prometheus exporter (served on the admin listener), traces to stdout or
// OTLP when the OTel environment asks for them. A nil *observer is off:
// every method passes through.
type observer struct {
	rec      *otelidem.Recorder    // the middleware's events and store calls
	tasks    *otelpgstore.Recorder // submits, attempts, worker events, task counts
	mp       *sdkmetric.MeterProvider
	tp       *sdktrace.TracerProvider // nil when traces are off
	metrics  http.Handler
	traceOut string // what the startup line says about traces
}

// newObserver sets up the SDK for a process named service ("serve", "worker").
func newObserver(ctx context.Context, s obsSettings, service string) (*observer, error) {
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "idemgate-example"),
			attribute.String("idemgate.example.command", service)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil {
		return nil, fmt.Errorf("otel resource: %w", err)
	}
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("otel prometheus exporter: %w", err)
	}
	o := &observer{
		mp:      sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res)),
		metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
	}
	var tp trace.TracerProvider = noop.NewTracerProvider()
	kind, proto, _ := strings.Cut(s.traces, "+")
	var spans sdktrace.SpanExporter
	switch kind {
	case "", "none":
		o.traceOut = "off (set OTEL_TRACES_EXPORTER=console or OTEL_EXPORTER_OTLP_ENDPOINT)"
	case "console", "stdout":
		spans, err = stdouttrace.New(stdouttrace.WithWriter(s.stdout))
		o.traceOut = "to stdout"
	case "otlp":
		if proto != "" && proto != "http/protobuf" {
			err = fmt.Errorf("OTLP protocol %q: this example sends traces over http/protobuf only", proto)
			break
		}
		spans, err = otlptracehttp.New(ctx) // reads OTEL_EXPORTER_OTLP_* itself
		o.traceOut = "over OTLP/HTTP (OTEL_EXPORTER_OTLP_*)"
	default:
		err = fmt.Errorf("OTEL_TRACES_EXPORTER=%q: want otlp, console or none", kind)
	}
	if err != nil {
		_ = o.mp.Shutdown(ctx)
		return nil, fmt.Errorf("otel traces: %w", err)
	}
	if spans != nil {
		o.tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(spans), sdktrace.WithResource(res))
		tp = o.tp
	}
	o.rec, err = otelidem.New(otelidem.Config{MeterProvider: o.mp, TracerProvider: tp, Tenant: s.tenantMetrics})
	if err == nil {
		o.tasks, err = otelpgstore.New(otelpgstore.Config{MeterProvider: o.mp, TracerProvider: tp})
	}
	if err != nil {
		_ = o.shutdown(ctx)
		return nil, err
	}
	return o, nil
}

// shutdown flushes the spans and stops the providers.
func (o *observer) shutdown(ctx context.Context) error {
	if o == nil {
		return nil
	}
	var err error
	if o.tp != nil {
		err = o.tp.Shutdown(ctx)
	}
	return errors.Join(err, o.mp.Shutdown(ctx))
}

// instrument adds a server span to every request of e.
func (o *observer) instrument(e *echo.Echo) {
	if o == nil {
		return
	}
	e.Use(o.rec.ServerWithSkipper(func(c echo.Context) bool {
		p := c.Path()
		return p == "/healthz" || p == "/" || strings.HasPrefix(p, "/web/")
	}))
}

// store wraps the middleware's store in spans and durations.
func (o *observer) store(s idemgate.Store) idemgate.Store {
	if o == nil {
		return s
	}
	return o.rec.Store(s)
}

// onEvent records a middleware event.
func (o *observer) onEvent(ctx context.Context, ev idemgate.Event) {
	if o == nil {
		return
	}
	o.rec.OnEvent(ctx, ev)
}

// startObs starts the SDK and the admin listener of a process. With
// tasks, the process also reports the task store's counts and ages (the
// database's figures: the same from every process that reports them).
func startObs(ctx context.Context, s obsSettings, service string, tasks *pgstore.Store, stderr io.Writer) (*observer, *admin, error) {
	o, err := newObserver(ctx, s, service)
	if err != nil {
		return nil, nil, err
	}
	if tasks != nil {
		// Stopped with the meter provider at shutdown.
		if _, err := o.tasks.ObserveTasks(tasks, kindImages, kindMusic); err != nil {
			_ = o.shutdown(ctx)
			return nil, nil, err
		}
	}
	a, err := startAdmin(s, o, stderr)
	if err != nil {
		_ = o.shutdown(ctx)
		return nil, nil, err
	}
	return o, a, nil
}

// submit runs submit in a span and stores the request's trace with the
// task, so that its attempts join the request's trace.
func (o *observer) submit(ctx context.Context, t pgstore.NewTask,
	submit func(context.Context, pgstore.NewTask) (pgstore.Task, error)) (pgstore.Task, error) {
	if o == nil {
		return submit(ctx, t)
	}
	return o.tasks.Submit(ctx, t, submit)
}

// worker instruments a worker's config: attempt and reconcile spans, and
// the worker's events as metrics (after any OnEvent already set).
func (o *observer) worker(cfg *pgstore.WorkerConfig) {
	if o == nil {
		return
	}
	cfg.Handler = o.tasks.Attempt(cfg.Handler)
	if cfg.Reconcile != nil {
		cfg.Reconcile = o.tasks.Reconcile(cfg.Reconcile)
	}
	if prev := cfg.OnEvent; prev != nil {
		cfg.OnEvent = func(ev pgstore.WorkerEvent) {
			prev(ev)
			o.tasks.OnWorkerEvent(ev)
		}
	} else {
		cfg.OnEvent = o.tasks.OnWorkerEvent
	}
}
