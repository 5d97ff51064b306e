package otelpgstore

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// scope is the instrumentation scope of every instrument and span: the
// module's path, shared with otelidem, so that both packages' metrics sit
// under one scope.
const scope = "github.com/idemgate/idemgate/otelidem"

// Attribute keys. Kinds come from the application's code and states and
// outcomes from small fixed sets, so a series count never grows with
// traffic; the task id and attempt go on spans only.
const (
	keyTaskKind    = attribute.Key("idemgate.task.kind")
	keyTaskState   = attribute.Key("idemgate.task.state")
	keyTaskQueue   = attribute.Key("idemgate.task.queue")
	keyTaskOutcome = attribute.Key("idemgate.task.outcome")
	keyTaskID      = attribute.Key("idemgate.task.id")
	keyTaskAttempt = attribute.Key("idemgate.task.attempt")
	keyDuplicate   = attribute.Key("idemgate.task.duplicate")
	keyResult      = attribute.Key("idemgate.result")
)

// Config configures a Recorder.
type Config struct {
	// MeterProvider makes the instruments. Optional. Default
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider makes the spans. Optional. Default
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// AttemptSpanLimit bounds how long an attempt's span stays open after
	// its handler returned, waiting for the worker's event that says how
	// the attempt ended. Without one (the outcome write failed, the
	// process is stopping) the span ends then with the outcome "unknown".
	// Optional. Default 2 minutes.
	AttemptSpanLimit time.Duration
}

// Recorder turns pgstore's submits, attempts, worker events and task
// counts into instruments and spans. Its methods are safe for concurrent
// use.
type Recorder struct {
	cfg      Config
	tracer   trace.Tracer
	meter    metric.Meter
	attempts sync.Map // attemptKey → *openAttempt

	tasks          metric.Int64ObservableUpDownCounter
	oldest         metric.Float64ObservableGauge
	claimDur       metric.Float64Histogram
	attemptCount   metric.Int64Counter
	attemptDur     metric.Float64Histogram
	rescues        metric.Int64Counter
	stale          metric.Int64Counter
	outcomeRetries metric.Int64Counter

	maxRunning          metric.Int64ObservableGauge
	maxRunningPerTenant metric.Int64ObservableGauge
	startsPerSecond     metric.Float64ObservableGauge
	limitUsage          metric.Int64ObservableGauge
	paused              metric.Int64ObservableGauge
	heldBack            metric.Int64Counter
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
	if cfg.AttemptSpanLimit <= 0 {
		cfg.AttemptSpanLimit = 2 * time.Minute
	}
	m := cfg.MeterProvider.Meter(scope)
	r := &Recorder{cfg: cfg, tracer: cfg.TracerProvider.Tracer(scope), meter: m}
	var err, e error
	r.tasks, e = m.Int64ObservableUpDownCounter("idemgate.tasks", metric.WithUnit("{task}"),
		metric.WithDescription("Tasks in the task store by kind and state, read at each collection."))
	err = errors.Join(err, e)
	r.oldest, e = m.Float64ObservableGauge("idemgate.task.oldest.age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest runnable (pending, retrying) and the oldest uncertain task; 0 when there is none."))
	err = errors.Join(err, e)
	r.claimDur, e = m.Float64Histogram("idemgate.task.claim.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of the worker's claim statement, recorded once per task it claimed."),
		metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
	err = errors.Join(err, e)
	r.attemptCount, e = m.Int64Counter("idemgate.task.attempts", metric.WithUnit("{attempt}"),
		metric.WithDescription("Task attempts by how they ended (idemgate.task.outcome)."))
	err = errors.Join(err, e)
	r.attemptDur, e = m.Float64Histogram("idemgate.task.attempt.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of task attempts by how they ended."),
		metric.WithExplicitBucketBoundaries(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
	err = errors.Join(err, e)
	r.rescues, e = m.Int64Counter("idemgate.task.rescues", metric.WithUnit("{task}"),
		metric.WithDescription("Tasks whose lease expired and that were requeued or made uncertain by a rescue."))
	err = errors.Join(err, e)
	r.stale, e = m.Int64Counter("idemgate.task.stale_completions", metric.WithUnit("{completion}"),
		metric.WithDescription("Outcome writes refused by fencing: the attempt had been superseded."))
	err = errors.Join(err, e)
	r.outcomeRetries, e = m.Int64Counter("idemgate.task.outcome_write.retries", metric.WithUnit("{retry}"),
		metric.WithDescription("Outcome writes retried after a transient database error."))
	err = errors.Join(err, e)
	err = errors.Join(err, r.newLimitInstruments(m))
	if err != nil {
		return nil, fmt.Errorf("otelpgstore: instruments: %w", err)
	}
	return r, nil
}
