package migrate_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/migrate"
	"github.com/idemgate/idemgate/internal/migrate/migratetest"
	"github.com/idemgate/idemgate/internal/testenv"
)

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(testCtx(t), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// uniqueRunner builds a unique index on a table whose rows may repeat.
func uniqueRunner() *migrate.Runner {
	return &migrate.Runner{
		Package: "test", VersionTable: "dups_migrations", LockClass: 9003,
		Migrations: []migrate.Migration{
			{Version: 1, Name: "create", SQL: `CREATE TABLE dups (v int NOT NULL); INSERT INTO dups VALUES (1), (1)`},
			{Version: 2, Name: "unique v", Steps: []migrate.Step{
				{Name: "drop an invalid leftover", Run: migrate.DropIfUnusable("dups", "dups_v")},
				{Name: "build", Run: migrate.CreateIfAbsent("dups", "dups_v", `CREATE UNIQUE INDEX CONCURRENTLY dups_v ON dups (v)`)},
				{Name: "check", Run: migrate.RequireUsable("dups", "dups_v", true, []string{"v"})},
			}},
		},
	}
}

func script(t *testing.T, r *migrate.Runner) string {
	t.Helper()
	s, err := r.Script()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestScriptStopsOnAFailedBuild: a build that fails leaves an invalid
// index; the script run again (its pending versions) refuses it and says
// what to run, and after that it finishes, recording what Run records.
func TestScriptStopsOnAFailedBuild(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	conn := connect(t, dsn)
	ctx := testCtx(t)
	r := uniqueRunner()
	s := script(t, r)
	if err := migratetest.Apply(ctx, conn, s); err == nil || !strings.Contains(err.Error(), "could not create unique index") {
		t.Fatalf("the script on duplicate rows: %v", err)
	}
	pending := migrate.FilterScript(s, func(_ string, v int) bool { return v > 1 })
	if strings.Contains(pending, "CREATE TABLE dups") || !strings.Contains(pending, "CREATE TABLE IF NOT EXISTS") {
		t.Fatalf("FilterScript kept v1 or lost the setup:\n%s", pending)
	}
	if _, err := conn.Exec(ctx, `DELETE FROM dups WHERE ctid = (SELECT max(ctid) FROM dups)`); err != nil {
		t.Fatal(err)
	}
	err := migratetest.Apply(ctx, conn, pending)
	if err == nil || !strings.Contains(err.Error(), `index dups_v is invalid, left by a killed build: run DROP INDEX CONCURRENTLY "dups_v"`) {
		t.Fatalf("the script over an invalid leftover: %v", err)
	}
	if _, err := conn.Exec(ctx, `DROP INDEX CONCURRENTLY "dups_v"`); err != nil {
		t.Fatal(err)
	}
	if err := migratetest.Apply(ctx, conn, pending); err != nil {
		t.Fatal(err)
	}
	_, vs, err := r.Status(ctx, newPoolOn(t, dsn))
	if err != nil {
		t.Fatal(err)
	}
	if len(migrate.Pending(vs)) != 0 {
		t.Fatalf("status after the script: %+v", vs)
	}
}

// TestScriptReadsTheIndexBack: an index of the same name that is not the
// one the version builds (IF NOT EXISTS keeps it) fails the read-back.
func TestScriptReadsTheIndexBack(t *testing.T) {
	t.Parallel()
	conn := connect(t, testenv.PostgresDSN(t))
	ctx := testCtx(t)
	s := script(t, uniqueRunner())
	s = strings.Replace(s, "INSERT INTO dups VALUES (1), (1)", "CREATE INDEX dups_v ON dups (v)", 1)
	err := migratetest.Apply(ctx, conn, s)
	if err == nil || !strings.Contains(err.Error(), "index dups_v is not a valid index (unique=true) on v after its build") {
		t.Fatalf("the script over a non-unique index of the name: %v", err)
	}
}

// TestScriptNeedsSQLSteps: a step that is a plain function has no SQL.
func TestScriptNeedsSQLSteps(t *testing.T) {
	t.Parallel()
	r := &migrate.Runner{Package: "test", VersionTable: "x", Migrations: []migrate.Migration{
		{Version: 1, Name: "custom", Steps: []migrate.Step{{Name: "by hand", Run: func(ctx context.Context, s migrate.Session) error {
			_, err := s.Conn.Exec(ctx, "SELECT 1")
			return err
		}}}},
	}}
	if _, err := r.Script(); err == nil || !strings.Contains(err.Error(), `step "by hand" has no SQL form`) {
		t.Fatalf("Script = %v", err)
	}
}

// TestScriptEqualsRun: the test runner's script and Run build the same
// schema and versions.
func TestScriptEqualsRun(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	byRun, byScript := testenv.PostgresDSN(t), testenv.PostgresDSN(t)
	if err := runner("things", 9001).Run(ctx, newPoolOn(t, byRun)); err != nil {
		t.Fatal(err)
	}
	if err := migratetest.Apply(ctx, connect(t, byScript), script(t, runner("things", 9001))); err != nil {
		t.Fatal(err)
	}
	want, err := migratetest.Describe(ctx, connect(t, byRun), "things_migrations")
	if err != nil {
		t.Fatal(err)
	}
	got, err := migratetest.Describe(ctx, connect(t, byScript), "things_migrations")
	if err != nil {
		t.Fatal(err)
	}
	if got != want || !strings.Contains(got, "index CREATE INDEX things_v") {
		t.Fatalf("script:\n%s\nRun:\n%s", got, want)
	}
	if v := versions(t, newPoolOn(t, byScript), "things_migrations"); !slices.Equal(v, []int{1, 2}) {
		t.Fatalf("versions = %v", v)
	}
}

func newPoolOn(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(testCtx(t), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestScriptRefusesWhileRunHoldsTheLock: while Run (another node's
// Migrate) holds the schema's migration lock, the script refuses to start
// a version, transaction or steps, and says why; once the lock is free it
// runs, lets the lock go, and Run finds its work done.
func TestScriptRefusesWhileRunHoldsTheLock(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	dsn := testenv.PostgresDSN(t)
	holder := connect(t, dsn)
	r := runner("things", 9001)
	s := script(t, r)
	for _, v := range []int{1, 2} { // v1 is SQL in a transaction, v2 steps
		version := migrate.FilterScript(s, func(_ string, got int) bool { return got == v })
		if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext(current_schema()))`, r.LockClass); err != nil {
			t.Fatal(err)
		}
		err := migratetest.Apply(ctx, connect(t, dsn), version)
		if err == nil || !strings.Contains(err.Error(), "another migration of test is running on this schema") {
			t.Fatalf("v%d while Run holds the lock: %v", v, err)
		}
		if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock_all()`); err != nil {
			t.Fatal(err)
		}
		if err := migratetest.Apply(ctx, connect(t, dsn), version); err != nil {
			t.Fatalf("v%d once the lock is free: %v", v, err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := r.Run(wctx, newPoolOn(t, dsn)); err != nil {
		t.Fatalf("Run after the script: %v", err)
	}
	if v := versions(t, newPoolOn(t, dsn), "things_migrations"); !slices.Equal(v, []int{1, 2}) {
		t.Fatalf("versions = %v", v)
	}
}
