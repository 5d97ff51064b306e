package pgstore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Stats is a snapshot of the unfinished tasks, for metrics and alerts.
type Stats struct {
	// Counts is the number of unfinished tasks (pending, running,
	// retrying, uncertain) by kind and state, as stored. Finished tasks
	// are not counted: counting them would read the whole table; count
	// WorkerEvents for throughput instead. Running counts tasks whose
	// lease expired but which no rescue has taken back yet, and tasks
	// cancelled while their attempt stops; it leaves out running
	// Reconciles (their tasks are uncertain). Compare Attempts, not
	// Counts, with MaxRunning.
	Counts map[string]map[State]int
	// Attempts is the number of attempts by kind that count against the
	// kind's limits now, as a claim counts them: running attempts whose
	// lease has not ended (a dead worker's included, until it ends; one
	// cancelled counts until its handler stopped) and Reconcile calls
	// whose claim has not lapsed. Attempts[kind] beside
	// Limits[kind].MaxRunning is the kind's use of its limit.
	Attempts map[string]int
	// OldestRunnable is how long the task that has waited longest for a
	// worker has been runnable (pending or retrying, run_after passed):
	// the queue's lag. Zero when nothing is waiting.
	OldestRunnable time.Duration
	// OldestUncertain is the age (since Submit) of the oldest uncertain
	// task: such a task waits for a Reconcile, and without one it waits
	// for ever. Zero when there is none.
	OldestUncertain time.Duration
	// Limits are the KindLimits of every kind that has some (paused
	// kinds included). Attempts[kind] beside Limits[kind].MaxRunning is
	// the kind's use of its limit; the WorkerHeldBack event counts the
	// claims a limit held back.
	Limits map[string]KindLimits
}

// Stats reads the counts of unfinished tasks, of the attempts holding
// their task, and the ages of the oldest waiting ones, in one statement
// that reads only unfinished tasks, and the kinds' limits.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	type group struct {
		Kind       string `db:"kind"`
		State      State  `db:"state"`
		N          int64  `db:"n"`
		RunnableUS int64  `db:"runnable_us"`
		OldestUS   int64  `db:"oldest_us"`
	}
	rows, _ := s.pool.Query(ctx, sqlStats)
	groups, err := pgx.CollectRows(rows, pgx.RowToStructByName[group])
	if err != nil {
		return Stats{}, interpretError("stats", err)
	}
	st := Stats{Counts: map[string]map[State]int{}, Attempts: map[string]int{}}
	for _, g := range groups {
		if g.State == State(statsHolding) {
			st.Attempts[g.Kind] += int(g.N)
			continue
		}
		if st.Counts[g.Kind] == nil {
			st.Counts[g.Kind] = map[State]int{}
		}
		st.Counts[g.Kind][g.State] = int(g.N)
		switch g.State {
		case StatePending, StateRetrying:
			st.OldestRunnable = max(st.OldestRunnable, time.Duration(g.RunnableUS)*time.Microsecond)
		case StateUncertain:
			st.OldestUncertain = max(st.OldestUncertain, time.Duration(g.OldestUS)*time.Microsecond)
		}
	}
	if st.Limits, err = s.allKindLimits(ctx); err != nil {
		return Stats{}, err
	}
	return st, nil
}
