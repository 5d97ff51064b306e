package pgstore

import (
	"context"
	"errors"
	"time"

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
	// after is the line the next sweep of idemgate_waiting_tenants
	// starts after (the zero line: the first); only maintain's goroutine
	// uses it.
	after waitingLine
	// listAfter is the line the next listing pass (listUnlisted) starts
	// after; only maintain's goroutine uses it.
	listAfter waitingLine
	// swept is when maintain last swept (see sweepEvery).
	swept time.Time
	// minAge is how long a line stays listed at least (sweepMinAge; 0 in
	// tests that sweep at once).
	minAge time.Duration
}

// sweepMinAge is how long a line stays listed at least, even empty: the
// time a SubmitTx's transaction has between listing its line and writing
// its task (see sqlListLine).
const sweepMinAge = time.Minute

// sweepEvery is how often, at most, a worker's maintenance sweeps
// idemgate_waiting_tenants: a line left over costs a walking claim a
// short row, and a sweep at every RescueInterval (50 ms in some
// deployments' tests) would take pool connections from the claims for
// nothing.
const sweepEvery = 5 * time.Second

// maybeSweepWaiting sweeps, and lists the lines the triggers missed
// (listUnlisted), if sweepEvery has passed since the last sweep.
func (r *rescuer) maybeSweepWaiting(ctx context.Context) error {
	if !r.swept.IsZero() && time.Since(r.swept) < sweepEvery {
		return nil
	}
	r.swept = time.Now()
	if _, err := r.sweepWaiting(ctx); err != nil {
		return err
	}
	listed, err := r.listUnlisted(ctx)
	if listed > 0 {
		r.cfg.Logger.Warn("pgstore: worker: listed waiting lines that no trigger had listed (tasks written with triggers off?)",
			"lines", listed)
	}
	return err
}

// waitingLine is a row of idemgate_waiting_tenants.
type waitingLine struct {
	Kind     string
	Priority int16
	Tenant   string
}

// sweepBatch bounds the lines one sweep examines, and so the advisory
// locks its transaction takes.
const sweepBatch = 256

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

// sweepWaiting removes from idemgate_waiting_tenants up to a batch of
// lines that have no task waiting, starting after the last line it
// examined (from the first line again once it reached the end), and
// returns how many it removed. A line left behind costs a claim's walk a
// short row and, if its tenant is not capped, one index descent.
func (r *rescuer) sweepWaiting(ctx context.Context) (int64, error) {
	var examined, removed int64
	var last waitingLine
	// The sweep needs READ COMMITTED (its second step reads a newer
	// snapshot; under another isolation it removes nothing), whatever the
	// database's default_transaction_isolation. The three statements go in
	// one batch: the sweep's locks are not held across a round trip.
	b := &pgx.Batch{}
	b.Queue(`BEGIN ISOLATION LEVEL READ COMMITTED`)
	b.Queue(sqlSweepWaiting, pgx.NamedArgs{"kind": r.after.Kind, "priority": r.after.Priority,
		"tenant": r.after.Tenant, "limit": sweepBatch, "min_age_us": r.minAge.Microseconds()}).QueryRow(func(row pgx.Row) error {
		return row.Scan(&examined, &last.Kind, &last.Priority, &last.Tenant, &removed)
	})
	b.Queue(`COMMIT`)
	if err := r.pool.SendBatch(ctx, b).Close(); err != nil {
		return 0, interpretError("sweep waiting tenants", err)
	}
	r.after = last
	if examined < sweepBatch {
		r.after = waitingLine{}
	}
	return removed, nil
}
