package testenv_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/internal/wait"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

func TestPostgresDSNGivesEachTestItsOwnDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := testenv.PostgresDSN(t), testenv.PostgresDSN(t)
	if a == b {
		t.Fatalf("two calls gave the same DSN %q", a)
	}
	connA, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer connA.Close(ctx)
	if _, err := connA.Exec(ctx, "CREATE TABLE only_in_a (x int)"); err != nil {
		t.Fatal(err)
	}
	connB, err := pgx.Connect(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer connB.Close(ctx)
	var n int
	if err := connB.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("table created in one test database is visible in another")
	}
}

// TestPostgresDSNDatabaseIsDroppedAfterItsTest: a database goes when its
// test ends, on the throwaway server in the background, so the check
// waits (with patience) for it to leave pg_database.
func TestPostgresDSNDatabaseIsDroppedAfterItsTest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var name string
	t.Run("user", func(t *testing.T) {
		cfg, err := pgx.ParseConfig(testenv.PostgresDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		name = cfg.Database
	})
	admin := testenv.PostgresDSN(t) // any database of the server
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var left bool
	var qerr error
	if !wait.Until(time.Minute, func() bool {
		qerr = conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&left)
		return qerr == nil && !left
	}) {
		t.Fatalf("database %s of an ended test still there after a minute (exists=%v, err=%v)", name, left, qerr)
	}
}

func TestRedisGivesEachTestItsOwnDB(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	optsA, optsB := testenv.Redis(t), testenv.Redis(t)
	a, b := redis.NewClient(optsA), redis.NewClient(optsB)
	defer a.Close()
	defer b.Close()
	if err := a.Set(ctx, "k", "from-a", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if testenv.RedisServer(t) != nil {
		if err := b.Get(ctx, "k").Err(); err != redis.Nil {
			t.Fatalf("key set in one test DB is visible in another: %v", err)
		}
	}
	got, err := a.Get(ctx, "k").Result()
	if err != nil || got != "from-a" {
		t.Fatalf("Get = %q, %v; want from-a", got, err)
	}
}

func TestRedisClusterRejectsCrossSlotScripts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.RedisCluster(t)})
	defer c.Close()
	if err := c.Set(ctx, "testenv-a", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// "a" and "b" hash to different slots; a real cluster refuses the script.
	err := c.Eval(ctx, "return redis.call('MGET', KEYS[1], KEYS[2])", []string{"a", "b"}).Err()
	if err == nil {
		t.Fatal("cross-slot script succeeded; this is not a real cluster")
	}
}

// cleanupNow is a testing.TB whose cleanups run when run is called, so
// that a benchmark can pay each database's drop inside its loop.
type cleanupNow struct {
	testing.TB
	fns []func()
}

func (c *cleanupNow) Cleanup(f func()) { c.fns = append(c.fns, f) }

func (c *cleanupNow) run() {
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
	c.fns = nil
}

// BenchmarkPostgresDSNFrom is what a test pays for a database copied
// from a migrated template: its creation, and its cleanup as the test
// waits for it (go test -run '^$' -bench PostgresDSNFrom ./internal/testenv/).
func BenchmarkPostgresDSNFrom(b *testing.B) {
	prepare := func(ctx context.Context, dsn string) error {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		for i := range 20 {
			if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE TABLE t%d (id bigint PRIMARY KEY, body jsonb, at timestamptz DEFAULT now())", i)); err != nil {
				return err
			}
		}
		return nil
	}
	testenv.PostgresDSNFrom(b, "bench", prepare) // the server and the template, before the clock
	b.ResetTimer()
	for b.Loop() {
		c := &cleanupNow{TB: b}
		testenv.PostgresDSNFrom(c, "bench", prepare)
		c.run()
	}
}
