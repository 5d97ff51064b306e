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
// is cancelled, and so is one whose task was cancelled (its notification
// may have been missed: the lease is kept until its handler stopped).
// Reconciles hold no lease, but are checked for cancellation too. A
// heartbeat the database does not answer within its interval confirms
// nothing: the attempts' local deadlines run on.
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

// beat extends every lease once, and checks the Reconciles.
func (h *heartbeat) beat(ctx context.Context) error {
	qctx, cancel := context.WithTimeout(ctx, h.every)
	defer cancel()
	if err := h.extend(qctx); err != nil {
		return err
	}
	return h.checkReconciles(qctx)
}

// extend extends every lease once.
func (h *heartbeat) extend(ctx context.Context) error {
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
	type kept struct {
		lease
		Cancelled bool `db:"cancelled"`
	}
	sent := time.Now()
	rows, _ := h.pool.Query(ctx, sqlHeartbeat, pgx.NamedArgs{"ids": ids, "attempts": attempts,
		"lease_us": (h.lease + leaseMargin(h.lease)).Microseconds()})
	got, err := pgx.CollectRows(rows, pgx.RowToStructByName[kept])
	if err != nil {
		return interpretError("heartbeat", err)
	}
	still := make(map[lease]bool, len(got)) // the lease is kept; true: the task was cancelled
	for _, k := range got {
		still[k.lease] = k.Cancelled
	}
	for _, a := range held {
		cancelled, ok := still[lease{a.task.ID, a.task.Attempt}]
		switch {
		case ok:
			a.confirm(sent, h.lease)
			if cancelled {
				a.cancel(errCancelled)
			}
		case !a.settled.Load():
			a.cancel(errLeaseLost)
		}
	}
	return nil
}

// checkReconciles cancels the Reconciles whose task was cancelled.
func (h *heartbeat) checkReconciles(ctx context.Context) error {
	rec := h.attempts.reconciling()
	if len(rec) == 0 {
		return nil
	}
	ids := make([]string, len(rec))
	for i, a := range rec {
		ids[i] = a.task.ID
	}
	rows, _ := h.pool.Query(ctx, sqlCancelledOf, pgx.NamedArgs{"ids": ids})
	cancelled, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return interpretError("heartbeat", err)
	}
	for _, id := range cancelled {
		h.attempts.cancel(id)
	}
	return nil
}
