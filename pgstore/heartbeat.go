package pgstore

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// heartbeat extends the leases of a worker's running attempts. A lease it
// extends is confirmed from the heartbeat's send time on (the attempt's
// local deadline moves); an attempt whose task another attempt holds now
// is cancelled. A heartbeat the database does not answer within its
// interval confirms nothing: the attempts' local deadlines run on.
type heartbeat struct {
	pool     *pgxpool.Pool
	attempts *attempts
	lease    time.Duration
	every    time.Duration
	logger   *slog.Logger
}

func (h *heartbeat) run(ctx context.Context) {
	t := time.NewTicker(h.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := h.beat(ctx); err != nil && ctx.Err() == nil {
			h.logger.Error("pgstore: worker: heartbeat", "err", err)
		}
	}
}

// beat extends every lease once.
func (h *heartbeat) beat(ctx context.Context) error {
	held := h.attempts.leased()
	if len(held) == 0 {
		return nil
	}
	ids, attempts := make([]string, len(held)), make([]int, len(held))
	for i, a := range held {
		ids[i], attempts[i] = a.task.ID, a.task.Attempt
	}
	type lease struct {
		ID      string `db:"id"`
		Attempt int    `db:"attempt"`
	}
	sent := time.Now()
	qctx, cancel := context.WithTimeout(ctx, h.every)
	defer cancel()
	rows, _ := h.pool.Query(qctx, sqlHeartbeat, pgx.NamedArgs{"ids": ids, "attempts": attempts,
		"lease_us": (h.lease + leaseMargin(h.lease)).Microseconds()})
	kept, err := pgx.CollectRows(rows, pgx.RowToStructByName[lease])
	if err != nil {
		return interpretError("heartbeat", err)
	}
	still := make(map[lease]bool, len(kept))
	for _, k := range kept {
		still[k] = true
	}
	for _, a := range held {
		if still[lease{a.task.ID, a.task.Attempt}] {
			a.confirm(sent, h.lease)
		} else if !a.settled.Load() {
			a.cancel(errLeaseLost)
		}
	}
	return nil
}
