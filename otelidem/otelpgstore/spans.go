package otelpgstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgate/idemgate/otelidem/internal/redact"
	"github.com/idemgate/idemgate/pgstore"
)

// traceparent is the carrier key of pgstore's Task.Trace: a W3C traceparent.
const traceparent = "traceparent"

// w3c reads and writes Task.Trace: the column holds a W3C traceparent,
// whatever propagator the application uses for its requests.
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
		span.RecordError(redact.Error(err, t.IdempotencyKey))
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
