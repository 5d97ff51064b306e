package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/devserver"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/pgstore"
)

// backends are the stores a process uses, and how to let go of them.
type backends struct {
	pool  *pgxpool.Pool
	store *pgstore.Store
	redis redis.UniversalClient // nil for processes that need none
	// records is the idempotency records store when it is not Redis
	// (STORE=postgres); nil: Redis.
	records idemgate.Store

	// pgInfo and redisInfo say, for the startup lines, what is used.
	pgInfo, redisInfo string
	// throwaway is the directory of the throwaway cluster, if one was started.
	throwaway string

	closers []func() // run in reverse order by close
}

// close releases everything, the throwaway cluster last.
func (b *backends) close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
	b.closers = nil
}

// defaultPoolConns is the Postgres pool size unless DATABASE_URL sets
// pool_max_conns.
const defaultPoolConns = 32

// openBackends connects to Postgres (DATABASE_URL, or a throwaway cluster
// when embedded is allowed) and, with withRedis, to Redis (REDIS_URL, or an
// in-process miniredis), then migrates the schema.
func openBackends(ctx context.Context, s settings, withRedis, embedded bool) (*backends, error) {
	b := &backends{}
	if err := b.open(ctx, s, withRedis, embedded); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func (b *backends) open(ctx context.Context, s settings, withRedis, embedded bool) (err error) {

	dsn := s.databaseURL
	if dsn == "" {
		if !embedded {
			return errors.New("DATABASE_URL (or -database-url) is required: several processes must share one database")
		}
		pg, err := devserver.StartPostgres(ctx)
		if err != nil {
			return fmt.Errorf("start a throwaway PostgreSQL (set DATABASE_URL to use yours): %w", err)
		}
		b.closers = append(b.closers, func() { _ = pg.Stop() })
		dsn = pg.DSN("postgres")
		b.throwaway = pg.Dir
		b.pgInfo = fmt.Sprintf("throwaway cluster on %s in %s, removed on exit (set DATABASE_URL to keep data)", pg.Addr, pg.Dir)
	} else {
		b.pgInfo = redactURL(dsn)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		// pgx's default (4 on a 2-core machine) is too few for Atomic
		// routes: each holds a connection for its handler's transaction
		// while the handler, the lease renewal and other requests need
		// more.
		cfg.MaxConns = defaultPoolConns
	}
	b.pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	b.closers = append(b.closers, b.pool.Close)
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := b.pool.Ping(pingCtx); err != nil {
		return fmt.Errorf("postgres %s: %w", redactURL(dsn), err)
	}
	if b.store, err = pgstore.New(ctx, b.pool); err != nil {
		return err
	}
	if err := b.store.Migrate(ctx); err != nil {
		return err
	}

	if !withRedis {
		return nil
	}
	switch s.store {
	case "", "redis":
	case "postgres":
		return b.openPostgresRecords(ctx)
	default:
		return fmt.Errorf("STORE (-store) %q: want redis or postgres", s.store)
	}
	if s.redisURL == "" {
		mr := miniredis.NewMiniRedis()
		// Let TTLs run on the wall clock: leases and retention must expire
		// as they would on a real Redis (miniredis otherwise only moves
		// time with FastForward).
		mr.ClockTTL(true)
		if err := mr.Start(); err != nil {
			return fmt.Errorf("start miniredis: %w", err)
		}
		b.closers = append(b.closers, mr.Close)
		b.redis = redis.NewClient(&redis.Options{Addr: mr.Addr()})
		b.redisInfo = fmt.Sprintf("in-process miniredis on %s (set REDIS_URL for a real Redis)", mr.Addr())
	} else {
		opts, topology, err := parseRedisURL(s.redisURL)
		if err != nil {
			return fmt.Errorf("REDIS_URL: %w", err)
		}
		b.redis = redis.NewUniversalClient(opts)
		b.redisInfo = fmt.Sprintf("%s (%s)", redactURL(s.redisURL), topology)
	}
	b.closers = append(b.closers, func() { _ = b.redis.Close() })
	// Its own 10 s: Postgres' ping, pgstore.New and Migrate above may
	// have used up pingCtx on a loaded machine (seen in the chaos soak at
	// load 20+: "redis …: context deadline exceeded" at start).
	redisCtx, cancelRedis := context.WithTimeout(ctx, 10*time.Second)
	defer cancelRedis()
	if err := b.redis.Ping(redisCtx).Err(); err != nil {
		return fmt.Errorf("redis %s: %w", b.redisInfo, err)
	}
	return nil
}

// openPostgresRecords keeps the idempotency records in the tasks' database
// (pgrecords) instead of Redis, and sweeps expired records every minute.
func (b *backends) openPostgresRecords(ctx context.Context) error {
	records, err := pgrecords.New(ctx, b.pool)
	if err != nil {
		return err
	}
	if err := records.Migrate(ctx); err != nil {
		return err
	}
	b.records = records
	b.redisInfo = "none (STORE=postgres: idempotency records in PostgreSQL, swept every minute)"
	sweepCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Minute)
		defer t.Stop()
		for {
			select {
			case <-sweepCtx.Done():
				return
			case <-t.C:
				_, _ = records.Sweep(sweepCtx) // the next claim of a key reclaims it anyway
			}
		}
	}()
	b.closers = append(b.closers, func() { stop(); <-done })
	return nil
}

// redactURL hides a password in a URL for printing.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		return "(configured)"
	}
	return u.Redacted()
}
