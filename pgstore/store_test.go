package pgstore

import (
	"context"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/proxy"
	"github.com/idemgate/idemgate/internal/testenv"
)

func TestMain(m *testing.M) {
	if dsn := os.Getenv(workerProcessEnv); dsn != "" {
		os.Exit(workerProcess(dsn))
	}
	os.Exit(testenv.Main(m))
}

// patience bounds a wait for something that must happen (wait.For): it is
// generous, so that a test holds on a loaded machine, and costs nothing
// when the event comes at once.
const patience = 30 * time.Second

// hangBound returns a context that ends after patience, or when the test
// ends: a bound, not a timing, for calls that need no wait at all and
// must fail if they block instead of hanging the test. A test that
// repeats a race takes one a round: one short deadline for every round
// (15 s for five) was outrun in CI, at load 19 on 2 cores.
func hangBound(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	t.Cleanup(cancel)
	return ctx
}

// testDB is a fresh database of one test.
type testDB struct {
	dsn string
}

func newTestDB(t testing.TB) testDB {
	t.Helper()
	return testDB{dsn: testenv.PostgresDSN(t)}
}

// pool opens a pool on the database, closed when the test ends.
func (d testDB) pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// store returns a migrated Store on a new pool.
func (d testDB) store(t testing.TB) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := New(ctx, d.pool(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// storeWith returns a Store on a new pool of the database, whose config
// configure changes first, closed when the test ends; the schema is
// migrated on a pool of its own.
func (d testDB) storeWith(t testing.TB, configure func(*pgxpool.Config)) *Store {
	t.Helper()
	d.store(t) // migrated
	cfg, err := pgxpool.ParseConfig(d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	configure(cfg)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := New(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// setup gives a test a migrated Store on a database of its own: a copy
// of a database migrated once per test binary (the tests of Migrate itself
// start from newTestDB's empty one).
func setup(t testing.TB) (*Store, testDB) {
	t.Helper()
	db := newMigratedDB(t)
	return db.store(t), db
}

// newMigratedDB is a fresh database of one test, its schema migrated.
func newMigratedDB(t testing.TB) testDB {
	t.Helper()
	return testDB{dsn: testenv.PostgresDSNFrom(t, "pgstore", func(ctx context.Context, dsn string) error {
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			return err
		}
		defer pool.Close()
		return newStore(pool).Migrate(ctx)
	})}
}

// poolVia opens a pool on db whose connections all go through a new
// proxy, which a test freezes (proxy.Freeze) to partition the pool's
// node from the database and heals again.
func (d testDB) poolVia(t testing.TB) (*pgxpool.Pool, *proxy.Proxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	px, err := proxy.Start(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	host, port, err := net.SplitHostPort(px.Addr)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.ConnConfig.Fallbacks = nil
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	t.Cleanup(px.Heal) // first: a frozen pool could not close
	return pool, px
}
