package pgstore

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// rescueBatch bounds the rows one rescue statement touches.
const rescueBatch = 1000

// errLeaseExpiredInDB is the Err of a WorkerRescued event.
var errLeaseExpiredInDB = errors.New("pgstore: lease expired")

// rescuer takes back tasks whose lease expired: their worker died, hung
// or was cut off from the database. It acts only once a lease has ended
// by the database's clock, which already includes the lease holder's
// safety margin, so the holder has cancelled its attempt by then. Each
// task goes where its kind's lost-attempt policy, stored with the claim,
// says: uncertain, or back in line with backoff (failed past
// MaxAttempts).
type rescuer struct {
	pool *pgxpool.Pool
	cfg  *WorkerConfig
	emit func(WorkerEvent)
}

// rescue takes back expired tasks in batches and returns how many.
func (r *rescuer) rescue(ctx context.Context) (int64, error) {
	type rescued struct {
		ID      string `db:"id"`
		Kind    string `db:"kind"`
		Attempt int    `db:"attempt"`
		State   State  `db:"state"`
	}
	var total int64
	for {
		rows, _ := r.pool.Query(ctx, plantSQL(sqlRescue), pgx.NamedArgs{"limit": rescueBatch, "max_attempts": r.cfg.MaxAttempts,
			"reconcile_us":    r.cfg.ReconcileInterval.Microseconds(),
			"backoff_base_us": r.cfg.BackoffBase.Microseconds(), "backoff_max_us": r.cfg.BackoffMax.Microseconds(),
			"jitter": jitter})
		got, err := pgx.CollectRows(rows, pgx.RowToStructByName[rescued])
		if err != nil {
			return total, interpretError("rescue", err)
		}
		for _, t := range got {
			r.emit(WorkerEvent{Type: WorkerRescued, Kind: t.Kind, TaskID: t.ID, Attempt: t.Attempt, Err: errLeaseExpiredInDB})
		}
		total += int64(len(got))
		if len(got) < rescueBatch {
			return total, nil
		}
	}
}
