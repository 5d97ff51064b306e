package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/multitracer"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/internal/devserver"
	"github.com/idemgate/idemgate/internal/pgtrace"
	"github.com/idemgate/idemgate/pgstore"
	"github.com/idemgate/idemgate/tools/internal/pgcpu"
)

// env is the Redis and Postgres of one run.
type env struct {
	redisOpts    *redis.Options // a single node; nil on a cluster
	clusterAddrs []string       // a cluster's primaries; nil on a single node
	// admin has a client per server (one, or each primary of a
	// cluster): INFO and DBSIZE add up over them. Their own calls are
	// not counted.
	admin        []*redis.Client
	databaseURL  string
	db           *pgxpool.Pool // counts rows, prepares the floor table
	pgServer     *pgcpu.Server // reads Postgres CPU; nil when the server is not on this machine
	redisVersion string
	pgVersion    string
	// tracer, when set before the stacks start (a test), also traces the
	// statements of every pool whose round trips are counted.
	tracer pgx.QueryTracer

	closers []func()
}

func (e *env) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

// startEnv connects to the given servers or starts throwaway ones.
func startEnv(ctx context.Context, o options, log io.Writer) (_ *env, err error) {
	e := &env{}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	switch {
	case o.cluster > 0:
		c, err := devserver.StartCluster(ctx, o.cluster)
		if err != nil {
			return nil, fmt.Errorf("start a redis cluster: %w", err)
		}
		e.closers = append(e.closers, func() { c.Stop() })
		e.clusterAddrs = c.Addrs()
		fmt.Fprintf(log, "redis cluster: throwaway, %d primaries on %s\n", o.cluster, strings.Join(e.clusterAddrs, ","))
	case o.redisURL != "":
		if e.redisOpts, err = redis.ParseURL(o.redisURL); err != nil {
			return nil, fmt.Errorf("parse -redis-url: %w", err)
		}
	default:
		srv, err := devserver.StartRedis(ctx, 0)
		if err != nil {
			return nil, fmt.Errorf("start redis-server: %w", err)
		}
		e.closers = append(e.closers, func() { srv.Stop() })
		e.redisOpts = &redis.Options{Addr: srv.Addr}
		fmt.Fprintf(log, "redis-server: throwaway on %s\n", srv.Addr)
	}
	if e.clusterAddrs == nil {
		e.admin = []*redis.Client{redis.NewClient(e.redisOpts)}
	}
	for _, addr := range e.clusterAddrs {
		e.admin = append(e.admin, redis.NewClient(&redis.Options{Addr: addr}))
	}
	for _, c := range e.admin {
		e.closers = append(e.closers, func() { c.Close() })
	}
	if e.redisVersion, err = redisVersion(ctx, e.admin[0]); err != nil {
		return nil, err
	}
	if e.clusterAddrs != nil {
		e.redisVersion += fmt.Sprintf(" (cluster of %d primaries)", len(e.clusterAddrs))
	}

	e.databaseURL = o.databaseURL
	if e.databaseURL == "" {
		pg, err := devserver.StartPostgres(ctx)
		if err != nil {
			return nil, fmt.Errorf("start postgres: %w", err)
		}
		e.closers = append(e.closers, func() { pg.Stop() })
		e.databaseURL = pg.DSN("postgres")
		fmt.Fprintf(log, "postgres: throwaway on %s\n", pg.Addr)
	}
	if e.db, err = pgxpool.New(ctx, e.databaseURL); err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	e.closers = append(e.closers, e.db.Close)
	if err := e.db.QueryRow(ctx, "SHOW server_version").Scan(&e.pgVersion); err != nil {
		return nil, fmt.Errorf("postgres version: %w", err)
	}
	if srv, err := pgcpu.Find(ctx, e.db); err != nil {
		fmt.Fprintf(log, "postgres CPU is not measured: %v\n", err)
	} else {
		e.pgServer = srv
	}
	return e, nil
}

// newPool opens a pool of n connections for one stack; a non-nil rt
// counts its round trips.
func (e *env) newPool(ctx context.Context, n int, rt *pgtrace.RoundTrips) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(e.databaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	cfg.MaxConns = int32(n)
	cfg.MinConns = int32(n)
	switch {
	case rt != nil && e.tracer != nil:
		cfg.ConnConfig.Tracer = multitracer.New(rt, e.tracer)
	case rt != nil:
		cfg.ConnConfig.Tracer = rt
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	e.closers = append(e.closers, pool.Close)
	return pool, nil
}

// taskStore opens a pool of its own for one stack's task work and a
// pgstore.Store on it (the tasks table is migrated by bench.start).
func (e *env) taskStore(ctx context.Context, o options) (*pgstore.Store, error) {
	pool, err := e.newPool(ctx, o.pgConns, nil)
	if err != nil {
		return nil, err
	}
	store, err := pgstore.New(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %w", err)
	}
	return store, nil
}

// newRedis opens a client for one stack whose round trips are counted: a
// client of n connections, or on a cluster a cluster client with n per
// primary.
func (e *env) newRedis(n int, rt *roundTrips) redis.UniversalClient {
	var c redis.UniversalClient
	if e.clusterAddrs != nil {
		c = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: e.clusterAddrs, PoolSize: n, MinIdleConns: n, DisableIdentity: true,
		})
	} else {
		opts := *e.redisOpts
		opts.PoolSize = n
		opts.MinIdleConns = n
		opts.DisableIdentity = true
		c = redis.NewClient(&opts)
	}
	c.AddHook(rt)
	e.closers = append(e.closers, func() { c.Close() })
	return c
}

func redisVersion(ctx context.Context, c *redis.Client) (string, error) {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return "", fmt.Errorf("redis INFO server: %w", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v, nil
		}
	}
	return "unknown", nil
}

// cmdStat is one command's line of INFO commandstats.
type cmdStat struct {
	calls int64
	usec  int64 // time spent in the command, inside Redis
}

// commandStats returns calls and time per command from INFO commandstats,
// added up over the servers.
func commandStats(ctx context.Context, servers []*redis.Client) (map[string]cmdStat, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out := map[string]cmdStat{}
	for _, c := range servers {
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			return nil, fmt.Errorf("redis INFO commandstats: %w", err)
		}
		for name, st := range parseCommandStats(info) {
			sum := out[name]
			sum.calls += st.calls
			sum.usec += st.usec
			out[name] = sum
		}
	}
	return out, nil
}

// parseCommandStats parses lines like
// "cmdstat_evalsha:calls=3,usec=40,usec_per_call=13.33,rejected_calls=0,failed_calls=0".
func parseCommandStats(info string) map[string]cmdStat {
	out := map[string]cmdStat{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, rest, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		name, isStat := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isStat {
			continue
		}
		var st cmdStat
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				fmt.Sscan(v, &st.calls)
			case "usec":
				fmt.Sscan(v, &st.usec)
			}
		}
		out[name] = st
	}
	return out
}

// roundTrips counts what a client sends for requests: one per command, one
// per pipeline. go-redis runs a new connection's handshake (HELLO, CLIENT
// SETINFO, SELECT, AUTH) through the hooks too; that is not a request's
// round trip, so it is not counted (else a pool growing mid-run inflates
// the figure).
type roundTrips struct {
	n atomic.Int64
}

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !isHandshake(cmd) {
			r.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if !isHandshake(cmd) {
				r.n.Add(1)
				break
			}
		}
		return next(ctx, cmds)
	}
}

// isHandshake reports a command go-redis sends when it opens a connection.
func isHandshake(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "hello", "client", "select", "auth":
		return true
	}
	return false
}

// server is what one INFO says about the whole server.
type server struct {
	cpu    float64 // seconds: used_cpu_sys + used_cpu_user
	memory int64   // used_memory
	keys   int64   // DBSIZE
}

// serverFigures reads INFO cpu, INFO memory and DBSIZE, added up over the
// servers.
func serverFigures(ctx context.Context, servers []*redis.Client) (server, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var s server
	for _, c := range servers {
		info, err := c.Info(ctx, "cpu", "memory").Result()
		if err != nil {
			return s, fmt.Errorf("redis INFO cpu memory: %w", err)
		}
		cpu, memory := parseServerInfo(info)
		keys, err := c.DBSize(ctx).Result()
		if err != nil {
			return s, fmt.Errorf("redis DBSIZE: %w", err)
		}
		s.cpu += cpu
		s.memory += memory
		s.keys += keys
	}
	return s, nil
}

// parseServerInfo reads used_cpu_sys, used_cpu_user (seconds) and
// used_memory (bytes) from INFO text.
func parseServerInfo(info string) (cpu float64, memory int64) {
	for _, line := range strings.Split(info, "\n") {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch name {
		case "used_cpu_sys", "used_cpu_user":
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				cpu += f
			}
		case "used_memory":
			n, err := strconv.ParseInt(v, 10, 64)
			if err == nil {
				memory = n
			}
		}
	}
	return cpu, memory
}
