package migrate_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/migrate"
	"github.com/idemgate/idemgate/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(testCtx(t), testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// runner has a transactional version (a table and a counter row) and a
// stepped one (an index built concurrently, then checked).
func runner(table string, class int32) *migrate.Runner {
	return &migrate.Runner{
		Package:      "test",
		VersionTable: table + "_migrations",
		LockClass:    class,
		Migrations: []migrate.Migration{
			{Version: 1, Name: "create", SQL: `CREATE TABLE ` + table + ` (id int PRIMARY KEY, v int NOT NULL);
				CREATE TABLE ` + table + `_applied (what text NOT NULL)`},
			{Version: 2, Name: "index v", Steps: []migrate.Step{
				{Name: "count", Run: migrate.Exec(`INSERT INTO ` + table + `_applied VALUES ('v2')`)},
				{Name: "drop an invalid leftover", Run: migrate.DropIfUnusable(table, table+"_v")},
				{Name: "build", Run: migrate.CreateIfAbsent(table, table+"_v", `CREATE INDEX CONCURRENTLY `+table+`_v ON `+table+` (v)`)},
				{Name: "check", Run: migrate.RequireUsable(table, table+"_v", false, []string{"v"})},
			}},
		},
	}
}

func versions(t *testing.T, pool *pgxpool.Pool, table string) []int {
	t.Helper()
	rows, _ := pool.Query(testCtx(t), `SELECT version FROM `+table+` ORDER BY version`)
	v, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestConcurrentRuns: many nodes migrate one schema at once; each version
// is applied once, and every run returns only when the schema is current.
func TestConcurrentRuns(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if err := runner("things", 9001).Run(testCtx(t), pool); err != nil {
				t.Errorf("Run: %v", err)
			}
			// Current when Run returns.
			if v := versions(t, pool, "things_migrations"); !slices.Equal(v, []int{1, 2}) {
				t.Errorf("versions after Run = %v", v)
			}
		})
	}
	wg.Wait()
	var n int
	if err := pool.QueryRow(testCtx(t), `SELECT count(*) FROM things_applied`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("v2's steps ran %d times, want once", n)
	}
}

// TestPackagesAreIndependent: two runners (two packages) in one schema keep
// their own versions and locks.
func TestPackagesAreIndependent(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	a, b := runner("alpha", 9001), runner("beta", 9002)
	var wg sync.WaitGroup
	for _, r := range []*migrate.Runner{a, b, a, b} {
		wg.Go(func() {
			if err := r.Run(testCtx(t), pool); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	wg.Wait()
	for _, table := range []string{"alpha_migrations", "beta_migrations"} {
		if v := versions(t, pool, table); !slices.Equal(v, []int{1, 2}) {
			t.Errorf("%s = %v, want [1 2]", table, v)
		}
	}
}

// TestKilledRunFinishes: a run whose connection dies at any step leaves a
// schema that the next run brings to the newest version.
func TestKilledRunFinishes(t *testing.T) {
	t.Parallel()
	steps := []string{"locked", "v1", "v2: count", "v2: build", "v2: check", "v2: record", "done"}
	for _, at := range steps {
		t.Run(at, func(t *testing.T) {
			t.Parallel()
			pool := newPool(t)
			r := runner("things", 9001)
			r.Hook = func(ctx context.Context, step string, conn *pgx.Conn) {
				if step == at {
					conn.Close(ctx) // the process dies here
				}
			}
			if err := r.Run(testCtx(t), pool); err == nil && at != "done" {
				t.Fatalf("Run with its connection closed at %q succeeded", at)
			}
			r.Hook = nil
			if err := r.Run(testCtx(t), pool); err != nil {
				t.Fatalf("rerun: %v", err)
			}
			if v := versions(t, pool, "things_migrations"); !slices.Equal(v, []int{1, 2}) {
				t.Errorf("versions = %v", v)
			}
		})
	}
}

// TestWaitIsBoundedByContext: a run waiting for another node's lock gives
// up when its context ends.
func TestWaitIsBoundedByContext(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	holder, err := pool.Acquire(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(testCtx(t), `SELECT pg_advisory_lock(9001, hashtext(current_schema()))`); err != nil {
		t.Fatal(err)
	}
	defer holder.Exec(context.Background(), `SELECT pg_advisory_unlock_all()`) //nolint:errcheck
	ctx, cancel := context.WithTimeout(testCtx(t), 300*time.Millisecond)
	defer cancel()
	if err := runner("things", 9001).Run(ctx, pool); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Run while another holds the lock = %v, want the deadline", err)
	}
}
