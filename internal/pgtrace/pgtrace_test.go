package pgtrace_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/pgtrace"
	"github.com/idemgate/idemgate/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// TestPGRoundTrips: a query, an exec, a batch and a copy are one round
// trip each; the statements inside a batch are not counted again, and
// neither is pgx's prepare of a statement it has not seen on a connection.
func TestRoundTrips(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rt := &pgtrace.RoundTrips{}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = rt
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rt.Load(); n != 0 {
		t.Fatalf("connecting counted %d round trips", n)
	}
	var one int
	if err := pool.QueryRow(ctx, `SELECT $1::int`, 1).Scan(&one); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TEMP TABLE rt (n int)`); err != nil {
		t.Fatal(err)
	}
	batch := &pgx.Batch{}
	for i := range 3 {
		batch.Queue(`SELECT $1::int`, i)
	}
	if err := pool.SendBatch(ctx, batch).Close(); err != nil {
		t.Fatal(err)
	}
	if n := rt.Load(); n != 3 {
		t.Errorf("a query, an exec and a batch of 3 counted %d round trips, want 3", n)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// A temp table lives on one connection: the pool has only one.
	if _, err := conn.Conn().CopyFrom(ctx, pgx.Identifier{"rt"}, []string{"n"}, pgx.CopyFromRows([][]any{{1}, {2}})); err != nil {
		t.Fatal(err)
	}
	if n := rt.Load(); n != 4 {
		t.Errorf("then a copy: %d round trips, want 4", n)
	}
	var nilRT *pgtrace.RoundTrips
	if n := nilRT.Load(); n != 0 {
		t.Errorf("a stack without a records pool: %d round trips", n)
	}
}
