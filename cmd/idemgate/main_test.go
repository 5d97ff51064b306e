package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/migrate/migratetest"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/pgstore"
)

// bin is the idemgate binary that TestMain builds.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idemgate-cli-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "idemgate")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := testenv.Main(m)
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// result is what one run of the binary did.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// idemgate runs the binary with env (NAME=value; nothing else of the
// test's environment but PATH) and stdin.
func idemgate(t *testing.T, env []string, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("idemgate %v: %v", args, err)
	}
	return r
}

// must runs the binary and fails the test unless it exits with want.
func must(t *testing.T, want int, env []string, args ...string) result {
	t.Helper()
	r := idemgate(t, env, "", args...)
	if r.code != want {
		t.Fatalf("idemgate %s: want exit %d, got %s", strings.Join(args, " "), want, r)
	}
	return r
}

func pool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// describe is what dsn's current schema holds, with both packages' versions.
func describe(t *testing.T, dsn string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	s, err := migratetest.Describe(ctx, conn, "idemgate_schema_migrations", "idemgate_records_migrations")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func contains(t *testing.T, r result, in string, wants ...string) {
	t.Helper()
	text := r.stdout
	if in == "stderr" {
		text = r.stderr
	}
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Fatalf("%s lacks %q: %s", in, w, r)
		}
	}
}

func TestUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		given    []string
		wantCode int
		want     string
	}{
		{"nothing", nil, 2, "operator tools"},
		{"help", []string{"-h"}, 0, "migrate up | status | sql"},
		{"unknown noun", []string{"recrods"}, 2, `unknown command "recrods"`},
		{"unknown verb", []string{"migrate", "down"}, 2, `unknown command "down"`},
		{"noun without verb", []string{"records"}, 2, "records show | release"},
		{"unknown flag", []string{"migrate", "status", "-shcema", "x"}, 2, "flag provided but not defined"},
		{"an operand too many", []string{"migrate", "status", "extra"}, 2, `unexpected argument "extra"`},
		{"records without a store", []string{"records", "show", "-key", "k"}, 2, `-store "": want redis or postgres`},
		{"records without a key", []string{"records", "show", "-store", "redis"}, 2, "give -tenant, -user, -request-id and -kind"},
		{"records with both", []string{"records", "show", "-store", "redis", "-key", "k", "-tenant", "t"}, 2, "not both"},
		{"records with a bad kind", []string{"records", "show", "-store", "redis", "-tenant", "t", "-user", "u", "-request-id", "r", "-kind", "Images!"}, 2, "kind"},
		{"tasks list -limit 0", []string{"tasks", "list", "-limit", "0"}, 2, "-limit 0: want 1 to 1000"},
		{"no DATABASE_URL", []string{"migrate", "status"}, 1, "DATABASE_URL (or -database-url) is required"},
		{"no REDIS_URL", []string{"records", "show", "-store", "redis", "-key", "k"}, 1, "REDIS_URL (or -redis-url) is required"},
		{"a REDIS_URL that is not one", []string{"records", "show", "-store", "redis", "-key", "k", "-redis-url", "http://h:1"}, 2, "scheme"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := must(t, tt.wantCode, nil, tt.given...)
			if !strings.Contains(r.stdout+r.stderr, tt.want) {
				t.Fatalf("want %q in the output: %s", tt.want, r)
			}
		})
	}
}

// TestMigrate: "migrate sql" needs no database; applied with psql it
// gives the schema "migrate up" gives, and status and up then find
// nothing to do.
func TestMigrate(t *testing.T) {
	t.Parallel()
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("no psql")
	}
	byUp, bySQL := testenv.PostgresDSN(t), testenv.PostgresDSN(t)

	r := must(t, 1, []string{"DATABASE_URL=" + byUp}, "migrate", "status", "-check")
	contains(t, r, "stdout", "pending", "pgstore", "pgrecords")
	contains(t, r, "stderr", "pending version(s)")
	if got := describe(t, byUp); got != "" {
		t.Fatalf("status created:\n%s", got)
	}
	must(t, 0, []string{"DATABASE_URL=" + byUp}, "migrate", "up")

	script := must(t, 0, nil, "migrate", "sql").stdout
	f := filepath.Join(t.TempDir(), "idemgate.sql")
	if err := os.WriteFile(f, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", f, bySQL).CombinedOutput(); err != nil {
		t.Fatalf("psql -f: %v\n%s", err, out)
	}
	if a, b := describe(t, byUp), describe(t, bySQL); a != b || !strings.Contains(a, "idemgate_records_migrations:1 ") {
		t.Fatalf("migrate up:\n%s\nmigrate sql | psql:\n%s", a, b)
	}
	r = must(t, 0, []string{"DATABASE_URL=" + bySQL}, "migrate", "status", "-check", "-json")
	var st struct {
		Schema   string
		Versions []struct {
			Package string
			Version int
			Applied bool
		}
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.Schema != "public" || len(st.Versions) < 9 {
		t.Fatalf("status -json: %v\n%s", err, r)
	}
	for _, v := range st.Versions {
		if !v.Applied {
			t.Fatalf("not applied after the script: %+v", v)
		}
	}
	before := describe(t, bySQL)
	must(t, 0, []string{"DATABASE_URL=" + bySQL}, "migrate", "up")
	if after := describe(t, bySQL); after != before {
		t.Fatalf("migrate up after the script changed the schema:\n%s", after)
	}
	// Nothing pending: -pending prints the setup and no version.
	r = must(t, 0, []string{"DATABASE_URL=" + bySQL}, "migrate", "sql", "-pending")
	if strings.Contains(r.stdout, "-- idemgate:begin") || !strings.Contains(r.stdout, "-- idemgate:setup pgstore") {
		t.Fatalf("sql -pending on a current schema: %s", r)
	}
	// -json splits the script into its setups and versions.
	r = must(t, 0, nil, "migrate", "sql", "-json", "-package", "pgstore")
	var chunks []struct {
		Package     string
		Version     int
		Transaction bool
		SQL         string
	}
	if err := json.Unmarshal([]byte(r.stdout), &chunks); err != nil || len(chunks) < 8 || chunks[0].Version != 0 ||
		chunks[1].Version != 1 || !chunks[1].Transaction || chunks[2].Version != 2 || chunks[2].Transaction ||
		!strings.Contains(chunks[2].SQL, "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS") {
		t.Fatalf("sql -json: %v\n%.2000s", err, r.stdout)
	}
}

// TestMigrateSchema: -schema migrates that schema and no other, and a
// schema that does not exist is an error, never created.
func TestMigrateSchema(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	p := pool(t, dsn)
	r := must(t, 1, []string{"DATABASE_URL=" + dsn}, "migrate", "up", "-schema", "tenant1")
	contains(t, r, "stderr", `schema "tenant1" does not exist`)
	if _, err := p.Exec(context.Background(), `CREATE SCHEMA tenant1`); err != nil {
		t.Fatal(err)
	}
	must(t, 0, []string{"DATABASE_URL=" + dsn}, "-h")
	must(t, 0, []string{"DATABASE_URL=" + dsn}, "migrate", "up", "-schema", "tenant1")
	must(t, 0, []string{"DATABASE_URL=" + dsn}, "migrate", "status", "-schema", "tenant1", "-check")
	r = must(t, 1, []string{"DATABASE_URL=" + dsn}, "migrate", "status", "-check")
	contains(t, r, "stdout", "schema public")
	r = must(t, 1, []string{"DATABASE_URL=" + dsn}, "tasks", "list")
	contains(t, r, "stderr", "schema public has no pgstore tables", "this command creates nothing")
	must(t, 0, []string{"DATABASE_URL=" + dsn}, "tasks", "list", "-schema", "tenant1")
	// The script of a schema sets its search_path.
	r = must(t, 0, nil, "migrate", "sql", "-schema", "tenant2")
	contains(t, r, "stdout", `SET search_path TO "tenant2";`)
}

// TestReadOnlyCommandsNeverMigrate: on an empty database and on one a
// version behind, every read-only command fails with what to do, and
// the schema is left as it was.
func TestReadOnlyCommandsNeverMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	empty, older := testenv.PostgresDSN(t), testenv.PostgresDSN(t)
	po := pool(t, older)
	s, _ := pgstore.New(ctx, po)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	rs, _ := pgrecords.New(ctx, po)
	if err := rs.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// A version behind, as far as the version tables say.
	if _, err := po.Exec(ctx, `DELETE FROM idemgate_schema_migrations WHERE version = (SELECT max(version) FROM idemgate_schema_migrations);
		DELETE FROM idemgate_records_migrations WHERE version = (SELECT max(version) FROM idemgate_records_migrations)`); err != nil {
		t.Fatal(err)
	}
	commands := [][]string{
		{"tasks", "list"}, {"tasks", "show", "00000000-0000-0000-0000-000000000000"}, {"tasks", "limits", "images"},
		{"records", "show", "-store", "postgres", "-key", "k"},
	}
	for name, db := range map[string]struct {
		dsn, want string
	}{"empty": {empty, "has no pg"}, "older": {older, "older than this command needs"}} {
		before := describe(t, db.dsn)
		for _, args := range commands {
			r := must(t, 1, []string{"DATABASE_URL=" + db.dsn}, args...)
			contains(t, r, "stderr", db.want, "idemgate migrate")
		}
		if after := describe(t, db.dsn); after != before {
			t.Fatalf("%s: a read-only command changed the schema:\n%s\nwas\n%s", name, after, before)
		}
	}
}

// A URL's password never shows: not in -h, not in a usage error, not in a
// connection error.
func TestPasswordsNeverShow(t *testing.T) {
	t.Parallel()
	env := []string{"DATABASE_URL=postgres://u:s3cretpw@127.0.0.1:1/db?connect_timeout=2",
		"REDIS_URL=redis://:s3cretpw@127.0.0.1:1/0"}
	for _, args := range [][]string{
		{"tasks", "list", "-h"}, {"tasks", "list", "-limit", "0"}, {"records", "show", "-h"},
		{"migrate", "status"}, {"records", "show", "-store", "redis", "-key", "k"}, {"tasks", "list"},
	} {
		r := idemgate(t, env, "", args...)
		if strings.Contains(r.stdout+r.stderr, "s3cretpw") {
			t.Errorf("idemgate %v shows the password: %s", args, r)
		}
	}
}
