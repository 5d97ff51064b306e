package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/pgstore"
)

// limitKind is the kind the limits mode limits: the clients submit images.
const limitKind = "images"

// limiter sets, changes, pauses and resumes the images kind's limits on a
// seeded schedule (the limits mode), recording each change with when it
// was asked and when it returned: a claim that began before a change
// returned may still run by the limits it read.
type limiter struct {
	sys *system
	rec *recorder
	rng *rand.Rand
	log func(format string, args ...any)
}

// run changes the limits every 2-6 s, a quarter of the times pausing the
// kind for 5-10 s after, until until; then it removes them, so
// that the backlog drains while the clients finish.
func (l *limiter) run(ctx context.Context, until time.Time) {
	pool, err := pgxpool.New(ctx, l.sys.pg.DSN("postgres"))
	if err != nil {
		l.log("limits: %v", err)
		return
	}
	defer pool.Close()
	store, err := pgstore.New(ctx, pool)
	if err != nil {
		l.log("limits: %v", err)
		return
	}
	defer l.set(context.WithoutCancel(ctx), store, pgstore.KindLimits{})
	for ctx.Err() == nil && time.Now().Before(until) {
		var k pgstore.KindLimits
		switch r := l.rng.IntN(10); {
		case r < 4:
			k.MaxRunning = 1 + l.rng.IntN(5)
		case r < 7:
			k.MaxRunningPerTenant = 1 + l.rng.IntN(3)
		case r < 9:
			k.MaxRunning, k.MaxRunningPerTenant = 2+l.rng.IntN(4), 1+l.rng.IntN(2)
		}
		l.set(ctx, store, k)
		sleep(ctx, min(time.Until(until), 2*time.Second+time.Duration(l.rng.Int64N(int64(4*time.Second)))))
		if l.rng.IntN(4) == 0 && time.Now().Before(until) {
			k.Paused = true
			l.set(ctx, store, k)
			// 5-10 s: longer than the checker's limitSlack (a claim may
			// read the limits that long before its call is logged) by
			// enough for claims that ignore the pause to show.
			sleep(ctx, min(time.Until(until), 5*time.Second+time.Duration(l.rng.Int64N(int64(5*time.Second)))))
			k.Paused = false
			l.set(ctx, store, k)
		}
	}
}

// set stores k, retrying through Postgres faults for a few seconds, and
// records it.
func (l *limiter) set(ctx context.Context, store *pgstore.Store, k pgstore.KindLimits) {
	ev := Limit{Kind: limitKind, MaxRunning: k.MaxRunning, PerTenant: k.MaxRunningPerTenant, Paused: k.Paused, Asked: time.Now()}
	var err error
	for try := 0; try < 20; try++ {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = store.SetKindLimits(cctx, limitKind, k)
		cancel()
		if err == nil || ctx.Err() != nil {
			break
		}
		sleep(ctx, 250*time.Millisecond)
	}
	ev.Set = time.Now()
	if err != nil {
		// Not applied, as far as we know; it may have been: the record
		// keeps both ends so the checker allows either.
		ev.Err = err.Error()
	}
	l.rec.limit(ev)
	if err != nil {
		l.log("limits: %v", fmt.Errorf("set %+v: %w", k, err))
	}
}
