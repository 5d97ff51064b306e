package otelidem

import (
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Attribute keys of the task instruments.
const (
	keyTaskKind    = attribute.Key("idemgate.task.kind")
	keyTaskState   = attribute.Key("idemgate.task.state")
	keyTaskQueue   = attribute.Key("idemgate.task.queue")
	keyTaskOutcome = attribute.Key("idemgate.task.outcome")
	keyTaskID      = attribute.Key("idemgate.task.id")
	keyTaskAttempt = attribute.Key("idemgate.task.attempt")
	keyDuplicate   = attribute.Key("idemgate.task.duplicate")
)

// taskInstruments are the instruments fed by pgstore's workers and stats.
type taskInstruments struct {
	meter          metric.Meter
	tasks          metric.Int64ObservableUpDownCounter
	oldest         metric.Float64ObservableGauge
	claimDur       metric.Float64Histogram
	attempts       metric.Int64Counter
	attemptDur     metric.Float64Histogram
	rescues        metric.Int64Counter
	stale          metric.Int64Counter
	outcomeRetries metric.Int64Counter
}

func newTaskInstruments(m metric.Meter) (*taskInstruments, error) {
	t := &taskInstruments{meter: m}
	var err, e error
	t.tasks, e = m.Int64ObservableUpDownCounter("idemgate.tasks", metric.WithUnit("{task}"),
		metric.WithDescription("Tasks in the task store by kind and state, read at each collection."))
	err = errors.Join(err, e)
	t.oldest, e = m.Float64ObservableGauge("idemgate.task.oldest.age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest runnable (pending, retrying) and the oldest uncertain task; 0 when there is none."))
	err = errors.Join(err, e)
	t.claimDur, e = m.Float64Histogram("idemgate.task.claim.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of the worker's claim statement, recorded once per task it claimed."),
		metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
	err = errors.Join(err, e)
	t.attempts, e = m.Int64Counter("idemgate.task.attempts", metric.WithUnit("{attempt}"),
		metric.WithDescription("Task attempts by how they ended (idemgate.task.outcome)."))
	err = errors.Join(err, e)
	t.attemptDur, e = m.Float64Histogram("idemgate.task.attempt.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of task attempts by how they ended."),
		metric.WithExplicitBucketBoundaries(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
	err = errors.Join(err, e)
	t.rescues, e = m.Int64Counter("idemgate.task.rescues", metric.WithUnit("{task}"),
		metric.WithDescription("Tasks whose lease expired and that were requeued or made uncertain by a rescue."))
	err = errors.Join(err, e)
	t.stale, e = m.Int64Counter("idemgate.task.stale_completions", metric.WithUnit("{completion}"),
		metric.WithDescription("Outcome writes refused by fencing: the attempt had been superseded."))
	err = errors.Join(err, e)
	t.outcomeRetries, e = m.Int64Counter("idemgate.task.outcome_write.retries", metric.WithUnit("{retry}"),
		metric.WithDescription("Outcome writes retried after a transient database error."))
	err = errors.Join(err, e)
	return t, err
}
