package otelpgstore

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemgate/idemgate/pgstore"
)

// OnWorkerEvent records a worker event and ends the attempt's span. Set it
// as pgstore.WorkerConfig.OnEvent (or call it from yours).
func (r *Recorder) OnWorkerEvent(ev pgstore.WorkerEvent) {
	ctx := context.Background()
	kind := keyTaskKind.String(ev.Kind)
	switch ev.Type {
	case pgstore.WorkerClaimed:
		r.claimDur.Record(ctx, ev.Latency.Seconds(), metric.WithAttributes(kind))
		return
	case pgstore.WorkerRescued:
		r.rescues.Add(ctx, 1, metric.WithAttributes(kind))
		return
	case pgstore.WorkerOutcomeRetry:
		r.outcomeRetries.Add(ctx, 1, metric.WithAttributes(kind))
		return
	case pgstore.WorkerHeldBack:
		r.heldBack.Add(ctx, 1, metric.WithAttributes(kind))
		return
	case pgstore.WorkerStale:
		r.stale.Add(ctx, 1, metric.WithAttributes(kind))
	case pgstore.WorkerSucceeded, pgstore.WorkerFailed, pgstore.WorkerRetried, pgstore.WorkerUncertain,
		pgstore.WorkerCancelled, pgstore.WorkerTimedOut, pgstore.WorkerReconciled:
	default:
		// An event this package does not know (a newer pgstore's) is not
		// counted as the end of an attempt.
		return
	}
	// The end of an attempt.
	set := metric.WithAttributeSet(attribute.NewSet(kind, keyTaskOutcome.String(string(ev.Type))))
	r.attemptCount.Add(ctx, 1, set)
	r.attemptDur.Record(ctx, ev.Latency.Seconds(), set)
	if a, ok := r.attempts.LoadAndDelete(attemptKey{ev.TaskID, ev.Attempt}); ok {
		a.(*openAttempt).end(string(ev.Type), ev.Err)
	}
}
