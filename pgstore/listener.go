package pgstore

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// listener turns notifications into wake-ups and cancellations, on a
// connection of its own taken from the pool. Submit announces a burst of
// tasks once per notifyEvery, so after each notification the listener
// wakes the worker again recheck later: the timer restarts with every
// notification, so a task submitted quietly just after the burst's last
// announcement still waits at most recheck, never a poll interval.
type listener struct {
	pool    *pgxpool.Pool
	kinds   []string
	wake    func()
	cancel  func(taskID string)
	limits  func(kind string) // SetKindLimits set the limits of kind
	recheck time.Duration
	logger  *slog.Logger
}

// run listens until ctx ends, reconnecting with backoff; polling and
// heartbeats cover the gaps.
func (l *listener) run(ctx context.Context) {
	wait := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := l.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		l.logger.Warn("pgstore: worker: listen", "err", err)
		if !sleep(ctx, wait) {
			return
		}
		wait = min(2*wait, 10*time.Second)
	}
}

func (l *listener) listenOnce(ctx context.Context) error {
	pc, err := l.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// A listening session never goes back to the pool.
	conn := pc.Hijack()
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel+"; LISTEN "+cancelChannel+"; LISTEN "+limitsChannel); err != nil {
		return err
	}
	recheck := time.AfterFunc(time.Hour, l.wake)
	recheck.Stop()
	defer recheck.Stop()
	l.wake() // catch up on anything submitted before LISTEN
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		switch n.Channel {
		case cancelChannel:
			l.cancel(n.Payload)
		case limitsChannel:
			if len(l.kinds) == 0 || slices.Contains(l.kinds, n.Payload) {
				l.limits(n.Payload)
			}
		case notifyChannel:
			if len(l.kinds) > 0 && !slices.Contains(l.kinds, n.Payload) {
				continue
			}
			l.wake()
			recheck.Reset(l.recheck)
		}
	}
}
