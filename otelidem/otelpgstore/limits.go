package otelpgstore

import (
	"errors"

	"go.opentelemetry.io/otel/metric"

	"github.com/idemgate/idemgate/pgstore"
)

// newLimitInstruments makes the instruments of the kinds' limits
// (pgstore.KindLimits): the limits themselves, read by ObserveTasks, and
// the claims they held back, counted by OnWorkerEvent.
func (r *Recorder) newLimitInstruments(m metric.Meter) error {
	var err, e error
	r.maxRunning, e = m.Int64ObservableGauge("idemgate.task.limit.max_running", metric.WithUnit("{attempt}"),
		metric.WithDescription("The kind's MaxRunning: attempts of the kind that may run at once across all workers. No point while unset."))
	err = errors.Join(err, e)
	r.maxRunningPerTenant, e = m.Int64ObservableGauge("idemgate.task.limit.max_running_per_tenant", metric.WithUnit("{attempt}"),
		metric.WithDescription("The kind's MaxRunningPerTenant: attempts of the kind that may run at once per tenant. No point while unset."))
	err = errors.Join(err, e)
	r.startsPerSecond, e = m.Float64ObservableGauge("idemgate.task.limit.starts", metric.WithUnit("{start}/s"),
		metric.WithDescription("The kind's StartsPerSecond: attempt starts per second across all workers. No point while unset."))
	err = errors.Join(err, e)
	r.limitUsage, e = m.Int64ObservableGauge("idemgate.task.limit.usage", metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts of the kind that count against its limits now, as a claim counts them (pgstore.Stats.Attempts): a dead worker's until its lease ends, a cancelled one until its handler stopped."))
	err = errors.Join(err, e)
	r.paused, e = m.Int64ObservableGauge("idemgate.task.paused",
		metric.WithDescription("1 while the kind is paused (no attempt starts), 0 otherwise."))
	err = errors.Join(err, e)
	r.heldBack, e = m.Int64Counter("idemgate.task.held_back", metric.WithUnit("{claim}"),
		metric.WithDescription("Claims that left a due task of the kind waiting because of the kind's limits (paused, MaxRunning, MaxRunningPerTenant, StartsPerSecond)."))
	err = errors.Join(err, e)
	return err
}

// observeLimits reports kind's limits and their use: paused and usage
// always (0 included), each limit while it is set. An unset limit has no
// point rather than 0, so that usage / limit on a dashboard is absent for
// an unlimited kind, not infinite.
func (r *Recorder) observeLimits(o metric.Observer, kind string, l pgstore.KindLimits, attempts int) {
	attrs := metric.WithAttributes(keyTaskKind.String(kind))
	o.ObserveInt64(r.limitUsage, int64(attempts), attrs)
	var paused int64
	if l.Paused {
		paused = 1
	}
	o.ObserveInt64(r.paused, paused, attrs)
	if l.MaxRunning > 0 {
		o.ObserveInt64(r.maxRunning, int64(l.MaxRunning), attrs)
	}
	if l.MaxRunningPerTenant > 0 {
		o.ObserveInt64(r.maxRunningPerTenant, int64(l.MaxRunningPerTenant), attrs)
	}
	if l.StartsPerSecond > 0 {
		o.ObserveFloat64(r.startsPerSecond, l.StartsPerSecond, attrs)
	}
}
