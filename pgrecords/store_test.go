package pgrecords_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/middleware/storetest"
	"github.com/idemgate/idemgate/pgrecords"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// realLease is long enough for a loaded 2-core machine to answer within
// it, short enough to sleep through.
const realLease = 600 * time.Millisecond

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newPool returns a pool on a fresh, migrated database.
func newPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(testCtx(t), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func newStore(t *testing.T, pool *pgxpool.Pool) *pgrecords.Store {
	t.Helper()
	s, err := pgrecords.New(testCtx(t), pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestStoreConformance runs the store conformance suite on a real
// PostgreSQL server. The cases share one database (their keys are random).
func TestStoreConformance(t *testing.T) {
	t.Parallel()
	store := newStore(t, newPool(t, testenv.PostgresDSN(t)))
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		return storetest.Harness{Store: store, Advance: time.Sleep, Lease: realLease}
	})
}
