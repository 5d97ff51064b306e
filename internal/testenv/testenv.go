// Package testenv gives tests real servers: a PostgreSQL database, a Redis
// logical database and a Redis Cluster of their own.
//
// Servers start lazily, once per test binary, on free loopback ports
// (package devserver), and stop when Main returns; if the binary dies
// instead, the kernel kills them and the next start removes their files.
// Set TEST_DATABASE_URL, TEST_REDIS_URL or TEST_REDIS_CLUSTER (comma-separated
// host:port list) to use servers that already run instead.
//
// A package that uses it has
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/internal/devserver"
)

// env is the lazily started servers of one test binary.
type env struct {
	mu      sync.Mutex
	pg      *devserver.Postgres
	pgURL   string // admin URL (TEST_DATABASE_URL or the throwaway server's)
	pgErr   error
	redis   *devserver.Redis
	rdOpts  *redis.Options
	rdErr   error
	cluster *devserver.Cluster
	clAddrs []string
	clErr   error

	templates map[string]*template // PostgresDSNFrom's, by key

	// admin is one pool on the admin URL for every database this binary
	// creates and drops: a fresh connection costs about 40 ms on a quiet
	// 2-core machine, and each test paid two.
	adminOnce  sync.Once
	admin      *pgxpool.Pool
	adminErr   error
	fileCopy   bool // CREATE DATABASE … STRATEGY FILE_COPY (see createDB)
	drops      chan string
	dropsClose context.CancelFunc
	dropsDone  chan struct{}

	nextDB atomic.Int64
	nextRD atomic.Int64
}

// startLimit bounds starting a server and creating or dropping a
// database. It is generous on purpose: each is paid once per server or
// test, and on a loaded 2-core machine (load 20–30, the race detector
// beside several test binaries) initdb alone has taken most of a minute.
// A limit that a slow machine outruns fails every test of the binary.
const startLimit = 3 * time.Minute

// The servers of this test binary. A package-level value is the one
// exception to "no globals": a test binary has exactly one set of servers.
var servers env

// Main runs the tests and then stops every server this binary started.
func Main(m *testing.M) int {
	defer servers.stop()
	return m.Run()
}

func (e *env) stop() {
	// Drops still queued are left undone: the server and its files go.
	if e.dropsClose != nil {
		e.dropsClose()
		<-e.dropsDone
	}
	if e.admin != nil {
		e.admin.Close()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.pg != nil {
		e.pg.Stop()
	}
	if e.redis != nil {
		e.redis.Stop()
	}
	if e.cluster != nil {
		e.cluster.Stop()
	}
}

// unavailable fails the test, or skips it under -short, when a server
// cannot be had.
func unavailable(t testing.TB, what string, err error) {
	t.Helper()
	if testing.Short() {
		t.Skipf("testenv: -short and no %s: %v", what, err)
	}
	if errors.Is(err, devserver.ErrMissing) {
		t.Fatalf("testenv: %s needed: %v\n(or set the TEST_* URL of a running server; -short skips real-server tests)", what, err)
	}
	t.Fatalf("testenv: %s: %v", what, err)
}

// PostgresDSN returns the connection string of a new, empty database that
// is dropped when the test ends.
func PostgresDSN(t testing.TB) string {
	t.Helper()
	return createDB(t, "")
}

// PostgresDSNFrom returns the connection string of a new database that is
// a copy of a template, dropped when the test ends. The template is made
// once per test binary and key: a new database on which prepare runs (to
// migrate a schema once instead of in every test). prepare must close its
// connections before it returns: a database cannot be copied while anyone
// is connected to it. If prepare fails, every test that asks for the key
// fails with its error.
func PostgresDSNFrom(t testing.TB, key string, prepare func(ctx context.Context, dsn string) error) string {
	t.Helper()
	admin := postgresAdminURL(t)
	servers.mu.Lock()
	if servers.templates == nil {
		servers.templates = map[string]*template{}
	}
	tm := servers.templates[key]
	if tm == nil {
		tm = &template{}
		servers.templates[key] = tm
	}
	servers.mu.Unlock()
	tm.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*startLimit)
		defer cancel()
		tm.name = fmt.Sprintf("idemgate_template_%d_%d", os.Getpid(), servers.nextDB.Add(1))
		pool, err := adminPool(admin)
		if err != nil {
			tm.err = err
			return
		}
		if _, err := pool.Exec(ctx, "CREATE DATABASE "+tm.name); err != nil {
			tm.err = fmt.Errorf("create template database: %w", err)
			return
		}
		cfg, err := pgx.ParseConfig(admin)
		if err != nil {
			tm.err = err
			return
		}
		if err := prepare(ctx, replaceDatabase(admin, cfg.Database, tm.name)); err != nil {
			tm.err = fmt.Errorf("prepare template %s: %w", key, err)
		}
	})
	if tm.err != nil {
		t.Fatalf("testenv: %v", tm.err)
	}
	return createDB(t, tm.name)
}

// template is a database made once per test binary to be copied.
type template struct {
	once sync.Once
	name string
	err  error
}

// adminPool returns the binary's pool on the admin URL, opening it on
// the first call; with it, whether CREATE DATABASE copies files, and the
// goroutine that drops the throwaway server's databases.
func adminPool(admin string) (*pgxpool.Pool, error) {
	servers.adminOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), startLimit)
		defer cancel()
		cfg, err := pgxpool.ParseConfig(admin)
		if err != nil {
			servers.adminErr = fmt.Errorf("parse %q: %w", admin, err)
			return
		}
		// Creations and drops of parallel tests go side by side; more
		// would only queue on the server's checkpoints.
		cfg.MaxConns = 4
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err == nil {
			err = pool.Ping(ctx)
		}
		if err != nil {
			if pool != nil {
				pool.Close()
			}
			servers.adminErr = fmt.Errorf("connect to postgres: %w", err)
			return
		}
		servers.admin = pool
		// PostgreSQL 15 copies a template through the WAL, block by block,
		// unless told to copy its files: 436 ms against 240 ms a database
		// in a pgstore run (log_min_duration_statement), and a fifth less
		// server CPU for the run (2026-12-06). Older servers copy files
		// and know no STRATEGY. A file copy makes the server checkpoint
		// twice: cheap on the throwaway server (fsync=off), not on a
		// server of TEST_DATABASE_URL, which keeps the default.
		var v int
		if ownServer() && pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&v) == nil && v >= 150000 {
			servers.fileCopy = true
		}
		if ownServer() {
			dctx, stop := context.WithCancel(context.Background())
			servers.drops, servers.dropsClose, servers.dropsDone = make(chan string, 4096), stop, make(chan struct{})
			go dropLoop(dctx, pool, servers.drops, servers.dropsDone)
		}
	})
	return servers.admin, servers.adminErr
}

// dropLoop drops the databases named on drops, one at a time, until ctx
// ends. On the throwaway server a test does not wait for its database's
// drop (DROP DATABASE … WITH (FORCE) took 150–300 ms of each test's time
// on a loaded machine), and an error costs only disk until the server
// and its files go at the end of the binary.
func dropLoop(ctx context.Context, pool *pgxpool.Pool, drops <-chan string, done chan<- struct{}) {
	defer close(done)
	for {
		select {
		case <-ctx.Done():
			return
		case name := <-drops:
			_, _ = pool.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		}
	}
}

// createDB creates a database, empty or a copy of from, dropped when the
// test ends, and returns its connection string.
func createDB(t testing.TB, from string) string {
	t.Helper()
	admin := postgresAdminURL(t)
	pool, err := adminPool(admin)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startLimit)
	defer cancel()
	name := fmt.Sprintf("idemgate_test_%d_%d", os.Getpid(), servers.nextDB.Add(1))
	create := "CREATE DATABASE " + name
	if from != "" {
		create += " TEMPLATE " + from
		if servers.fileCopy {
			create += " STRATEGY FILE_COPY"
		}
	}
	if _, err := pool.Exec(ctx, create); err != nil {
		t.Fatalf("testenv: create database: %v", err)
	}
	t.Cleanup(func() {
		if servers.drops != nil {
			select {
			case servers.drops <- name:
				return
			default: // a full queue: drop it here
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), startLimit)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("testenv: drop database: %v", err)
		}
	})
	cfg, err := pgx.ParseConfig(admin)
	if err != nil {
		t.Fatalf("testenv: parse %q: %v", admin, err)
	}
	return replaceDatabase(admin, cfg.Database, name)
}

// ownServer reports whether the PostgreSQL server is the throwaway one
// this binary started.
func ownServer() bool {
	servers.mu.Lock()
	defer servers.mu.Unlock()
	return servers.pg != nil
}

// replaceDatabase swaps the database in a postgres:// URL or key=value DSN.
func replaceDatabase(dsn, old, name string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		head, query, _ := strings.Cut(dsn, "?")
		if i := strings.LastIndex(head, "/"); i > strings.Index(head, "//")+1 {
			head = head[:i]
		}
		out := head + "/" + name
		if query != "" {
			out += "?" + query
		}
		return out
	}
	return dsn + " dbname=" + name
}

// PostgresServer returns the throwaway server itself (nil when
// TEST_DATABASE_URL is set), for tests that restart or inspect it.
func PostgresServer(t testing.TB) *devserver.Postgres {
	t.Helper()
	postgresAdminURL(t)
	servers.mu.Lock()
	defer servers.mu.Unlock()
	return servers.pg
}

func postgresAdminURL(t testing.TB) string {
	t.Helper()
	servers.mu.Lock()
	defer servers.mu.Unlock()
	if servers.pgURL == "" && servers.pgErr == nil {
		if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
			servers.pgURL = u
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), startLimit)
			defer cancel()
			servers.pg, servers.pgErr = devserver.StartPostgres(ctx)
			if servers.pgErr == nil {
				servers.pgURL = servers.pg.DSN("postgres")
			}
		}
	}
	if servers.pgErr != nil {
		unavailable(t, "PostgreSQL", servers.pgErr)
	}
	return servers.pgURL
}

// Redis returns options for a real redis-server and a logical database of
// this test's own, flushed when the test ends. With TEST_REDIS_URL the
// URL's database is shared and not flushed.
func Redis(t testing.TB) *redis.Options {
	t.Helper()
	servers.mu.Lock()
	if servers.rdOpts == nil && servers.rdErr == nil {
		if u := os.Getenv("TEST_REDIS_URL"); u != "" {
			servers.rdOpts, servers.rdErr = redis.ParseURL(u)
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), startLimit)
			servers.redis, servers.rdErr = devserver.StartRedis(ctx, 4096)
			cancel()
			if servers.rdErr == nil {
				servers.rdOpts = &redis.Options{Addr: servers.redis.Addr}
			}
		}
	}
	base, err, own := servers.rdOpts, servers.rdErr, servers.redis != nil
	servers.mu.Unlock()
	if err != nil {
		unavailable(t, "redis-server", err)
	}
	opts := *base
	if own {
		opts.DB = int(servers.nextRD.Add(1) % 4096)
		t.Cleanup(func() {
			c := redis.NewClient(&opts)
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = c.FlushDB(ctx).Err()
		})
	}
	return &opts
}

// RedisServer returns the throwaway redis-server (nil with TEST_REDIS_URL).
func RedisServer(t testing.TB) *devserver.Redis {
	t.Helper()
	Redis(t)
	servers.mu.Lock()
	defer servers.mu.Unlock()
	return servers.redis
}

// RedisCluster returns the addresses of a real 3-node Redis Cluster, shared
// by the tests of this binary (a cluster has one database: use distinct keys).
func RedisCluster(t testing.TB) []string {
	t.Helper()
	servers.mu.Lock()
	defer servers.mu.Unlock()
	if servers.clAddrs == nil && servers.clErr == nil {
		if s := os.Getenv("TEST_REDIS_CLUSTER"); s != "" {
			servers.clAddrs = strings.Split(s, ",")
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), startLimit)
			defer cancel()
			servers.cluster, servers.clErr = devserver.StartCluster(ctx, 3)
			if servers.clErr == nil {
				servers.clAddrs = servers.cluster.Addrs()
			}
		}
	}
	if servers.clErr != nil {
		unavailable(t, "Redis Cluster (redis-server and redis-cli)", servers.clErr)
	}
	return append([]string(nil), servers.clAddrs...)
}
