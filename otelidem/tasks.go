package otelidem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgate/idemgate/pgstore"
)

// traceparent is the carrier key of pgstore's Task.Trace: a W3C traceparent.
const traceparent = "traceparent"

// w3c reads and writes Task.Trace, whatever Config.Propagator is: the
// column holds a W3C traceparent.
var w3c propagation.TraceContext

// Submit runs submit(ctx, t) in a span, idemgate.task.submit, and stores
// the span's trace context in t.Trace (unless already set), so that the
// task's attempts join the request's trace. A duplicate submit returns the
// task of the first one, which keeps that request's trace.
func (r *Recorder) Submit(ctx context.Context, t pgstore.NewTask,
	submit func(context.Context, pgstore.NewTask) (pgstore.Task, error)) (pgstore.Task, error) {
	ctx, span := r.tracer.Start(ctx, "idemgate.task.submit", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(keyTaskKind.String(t.Kind)))
	defer span.End()
	if t.Trace == "" {
		c := propagation.MapCarrier{}
		w3c.Inject(ctx, c)
		t.Trace = c[traceparent]
	}
	task, err := submit(ctx, t)
	switch {
	case errors.Is(err, pgstore.ErrConflict):
		span.SetAttributes(keyResult.String("conflict"))
	case err != nil:
		span.RecordError(redacted{err, t.IdempotencyKey})
		span.SetStatus(codes.Error, "submit failed")
	default:
		span.SetAttributes(keyTaskID.String(task.ID), keyDuplicate.Bool(task.Duplicate),
			keyTaskState.String(string(task.State)))
	}
	return task, err
}

// Attempt returns h with a span around each attempt, idemgate.task.attempt,
// whose parent is the submitting request's span (from Task.Trace): one
// trace shows the request, its claim, the submit and every attempt. The
// span ends when OnWorkerEvent reports how the attempt ended (or, without
// that event, after Config.AttemptSpanLimit), so set WorkerConfig.OnEvent
// to r.OnWorkerEvent too.
func (r *Recorder) Attempt(h pgstore.Handler) pgstore.Handler {
	return r.wrap("idemgate.task.attempt", h)
}

// Reconcile is Attempt for WorkerConfig.Reconcile: its span is
// idemgate.task.reconcile.
func (r *Recorder) Reconcile(h pgstore.Handler) pgstore.Handler {
	return r.wrap("idemgate.task.reconcile", h)
}

// attemptKey names one attempt of one task.
type attemptKey struct {
	task    string
	attempt int
}

// openAttempt is an attempt's span waiting for its outcome event. Whoever
// removes it from Recorder.attempts (the event, the limit's timer, or a
// newer span of the same attempt) ends it, so it ends exactly once.
type openAttempt struct {
	span  trace.Span
	mu    sync.Mutex  // guards timer, set just after the attempt is stored
	timer *time.Timer // nil until set
}

func (r *Recorder) wrap(name string, h pgstore.Handler) pgstore.Handler {
	return func(ctx context.Context, t pgstore.Task) pgstore.Outcome {
		parent := trace.SpanContextFromContext(w3c.Extract(context.Background(), propagation.MapCarrier{traceparent: t.Trace}))
		opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
			keyTaskKind.String(t.Kind), keyTaskID.String(t.ID), keyTaskAttempt.Int(t.Attempt))}
		if parent.IsValid() {
			ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
		} else {
			opts = append(opts, trace.WithNewRoot())
		}
		ctx, span := r.tracer.Start(ctx, name, opts...)
		defer func() {
			if p := recover(); p != nil {
				span.SetStatus(codes.Error, "handler panicked")
				span.End()
				panic(p)
			}
		}()
		o := h(ctx, t)
		if !span.IsRecording() {
			span.End()
			return o
		}
		k := attemptKey{t.ID, t.Attempt}
		a := &openAttempt{span: span}
		// Stored before its timer starts: a timer that fired first would
		// find nothing to end, and the span would stay open for good.
		a.mu.Lock()
		if old, loaded := r.attempts.Swap(k, a); loaded {
			// The same attempt ran twice in this process (a resent claim):
			// the older span ends here.
			defer old.(*openAttempt).end("superseded", nil)
		}
		a.timer = time.AfterFunc(r.cfg.AttemptSpanLimit, func() {
			if r.attempts.CompareAndDelete(k, a) {
				a.end("unknown", nil)
			}
		})
		a.mu.Unlock()
		return o
	}
}

// end closes an attempt's span with its outcome.
func (a *openAttempt) end(outcome string, err error) {
	a.mu.Lock()
	if a.timer != nil {
		a.timer.Stop()
	}
	a.mu.Unlock()
	a.span.SetAttributes(keyTaskOutcome.String(outcome))
	switch outcome {
	case string(pgstore.WorkerSucceeded), string(pgstore.WorkerReconciled), string(pgstore.WorkerRetried):
	default:
		if err != nil {
			a.span.RecordError(err)
		}
		a.span.SetStatus(codes.Error, outcome)
	}
	a.span.End()
}

// OnWorkerEvent records a worker event and ends the attempt's span. Set it
// as pgstore.WorkerConfig.OnEvent (or call it from yours).
func (r *Recorder) OnWorkerEvent(ev pgstore.WorkerEvent) {
	ctx := context.Background()
	kind := keyTaskKind.String(ev.Kind)
	m := r.tasks
	switch ev.Type {
	case pgstore.WorkerClaimed:
		m.claimDur.Record(ctx, ev.Latency.Seconds(), metric.WithAttributes(kind))
		return
	case pgstore.WorkerRescued:
		m.rescues.Add(ctx, 1, metric.WithAttributes(kind))
		return
	case pgstore.WorkerOutcomeRetry:
		m.outcomeRetries.Add(ctx, 1, metric.WithAttributes(kind))
		return
	case pgstore.WorkerStale:
		m.stale.Add(ctx, 1, metric.WithAttributes(kind))
	}
	// The end of an attempt.
	set := metric.WithAttributeSet(attribute.NewSet(kind, keyTaskOutcome.String(string(ev.Type))))
	m.attempts.Add(ctx, 1, set)
	m.attemptDur.Record(ctx, ev.Latency.Seconds(), set)
	if a, ok := r.attempts.LoadAndDelete(attemptKey{ev.TaskID, ev.Attempt}); ok {
		a.(*openAttempt).end(string(ev.Type), ev.Err)
	}
}

// StatsReader is what ObserveTasks reads; *pgstore.Store is one.
type StatsReader interface {
	Stats(ctx context.Context) (pgstore.Stats, error)
}

// unfinished are the states Stats counts; each known kind reports all of
// them, zero included, so that a drained queue reads 0 rather than vanishing.
var unfinished = []pgstore.State{pgstore.StatePending, pgstore.StateRunning, pgstore.StateRetrying, pgstore.StateUncertain}

// ObserveTasks reports s's task counts (idemgate.tasks) and the age of
// its oldest runnable and uncertain task (idemgate.task.oldest.age),
// read with one Stats call per collection. Each of kinds, and every kind
// seen since, reports all its unfinished states, zeros included. Call the
// returned function to stop. One process is enough: the figures are the
// database's.
func (r *Recorder) ObserveTasks(s StatsReader, kinds ...string) (unregister func() error, err error) {
	m := r.tasks
	var mu sync.Mutex // two readers may collect at once
	known := map[string]bool{}
	for _, k := range kinds {
		known[k] = true
	}
	reg, err := m.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		st, err := s.Stats(ctx)
		if err != nil {
			return fmt.Errorf("otelidem: task stats: %w", err)
		}
		mu.Lock()
		defer mu.Unlock()
		for kind := range st.Counts {
			known[kind] = true
		}
		for kind := range known {
			for _, state := range unfinished {
				o.ObserveInt64(m.tasks, int64(st.Counts[kind][state]), metric.WithAttributes(
					keyTaskKind.String(kind), keyTaskState.String(string(state))))
			}
		}
		o.ObserveFloat64(m.oldest, st.OldestRunnable.Seconds(), metric.WithAttributes(keyTaskQueue.String("runnable")))
		o.ObserveFloat64(m.oldest, st.OldestUncertain.Seconds(), metric.WithAttributes(keyTaskQueue.String("uncertain")))
		return nil
	}, m.tasks, m.oldest)
	if err != nil {
		return nil, fmt.Errorf("otelidem: observe tasks: %w", err)
	}
	return reg.Unregister, nil
}
