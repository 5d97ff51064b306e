package pgstore

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

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

// setup gives a test a migrated Store on a database of its own.
func setup(t testing.TB) (*Store, testDB) {
	t.Helper()
	db := newTestDB(t)
	return db.store(t), db
}
