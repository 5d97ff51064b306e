package otelpgstore

import (
	"context"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/metric"

	"github.com/idemgate/idemgate/pgstore"
)

// StatsReader is what ObserveTasks reads; *pgstore.Store is one.
type StatsReader interface {
	Stats(ctx context.Context) (pgstore.Stats, error)
}

// unfinished are the states Stats counts; each known kind reports all of
// them, zero included, so that a drained queue reads 0 rather than vanishing.
var unfinished = []pgstore.State{pgstore.StatePending, pgstore.StateRunning, pgstore.StateRetrying, pgstore.StateUncertain}

// ObserveTasks reports s's task counts (idemgate.tasks), the age of its
// oldest runnable and uncertain task (idemgate.task.oldest.age) and the
// kinds' limits and their use (idemgate.task.limit.*, idemgate.task.paused), read with
// one Stats call per collection. Each of kinds, and every kind seen
// since, reports all its unfinished states and whether it is paused,
// zeros included; a limit is reported while it is set. Call the returned
// function to stop. One process is enough: the figures are the database's.
func (r *Recorder) ObserveTasks(s StatsReader, kinds ...string) (unregister func() error, err error) {
	var mu sync.Mutex // two readers may collect at once
	known := map[string]bool{}
	for _, k := range kinds {
		known[k] = true
	}
	reg, err := r.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		st, err := s.Stats(ctx)
		if err != nil {
			return fmt.Errorf("otelpgstore: task stats: %w", err)
		}
		mu.Lock()
		defer mu.Unlock()
		for kind := range st.Counts {
			known[kind] = true
		}
		for kind := range st.Limits {
			known[kind] = true
		}
		for kind := range st.Attempts {
			known[kind] = true
		}
		for kind := range known {
			for _, state := range unfinished {
				o.ObserveInt64(r.tasks, int64(st.Counts[kind][state]), metric.WithAttributes(
					keyTaskKind.String(kind), keyTaskState.String(string(state))))
			}
		}
		o.ObserveFloat64(r.oldest, st.OldestRunnable.Seconds(), metric.WithAttributes(keyTaskQueue.String("runnable")))
		o.ObserveFloat64(r.oldest, st.OldestUncertain.Seconds(), metric.WithAttributes(keyTaskQueue.String("uncertain")))
		for kind := range known {
			r.observeLimits(o, kind, st.Limits[kind], st.Attempts[kind])
		}
		return nil
	}, r.tasks, r.oldest, r.maxRunning, r.maxRunningPerTenant, r.startsPerSecond, r.limitUsage, r.paused)
	if err != nil {
		return nil, fmt.Errorf("otelpgstore: observe tasks: %w", err)
	}
	return reg.Unregister, nil
}
