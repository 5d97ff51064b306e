package main_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/internal/testenv"
)

// describeSchema lists the columns, indexes, functions and applied
// versions in schema, by name: migratetest.Describe reads the
// current_schema() through to_regnamespace, which a name that needs
// quoting does not pass.
func describeSchema(t *testing.T, dsn, schema string) string {
	t.Helper()
	ctx := context.Background()
	var got *string
	err := pool(t, dsn).QueryRow(ctx, `SELECT string_agg(x, E'\n' ORDER BY x) FROM (
		SELECT c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
		UNION ALL SELECT indexdef FROM pg_indexes WHERE schemaname = $1
		UNION ALL SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')'
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1) s(x)`, schema).Scan(&got)
	if err != nil {
		t.Fatal(err)
	}
	out := ""
	if got != nil {
		out = *got
	}
	for _, table := range []string{"idemgate_schema_migrations", "idemgate_records_migrations"} {
		var versions *string
		q := "SELECT string_agg(version::text, ',' ORDER BY version) FROM " + pgx.Identifier{schema, table}.Sanitize()
		if err := pool(t, dsn).QueryRow(ctx, q).Scan(&versions); err == nil && versions != nil {
			out += "\n" + table + ":" + *versions
		}
	}
	return out
}

// A careless operator runs "migrate sql -schema S | psql" twice, into a
// schema whose name needs quoting: the schema is the one "migrate up
// -schema S" makes, nothing lands in public, and the second run is
// refused, changes nothing, and names what to run instead (-pending).
func TestMigrateScriptTwiceIntoAQuotedSchema(t *testing.T) {
	t.Parallel()
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("no psql")
	}
	const schema = `Odd "Schema"-1`
	byUp, bySQL := testenv.PostgresDSN(t), testenv.PostgresDSN(t)
	for _, dsn := range []string{byUp, bySQL} {
		if _, err := pool(t, dsn).Exec(context.Background(), "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
			t.Fatal(err)
		}
	}
	must(t, 0, []string{"DATABASE_URL=" + byUp}, "migrate", "up", "-schema", schema)
	script := must(t, 0, nil, "migrate", "sql", "-schema", schema).stdout
	f := filepath.Join(t.TempDir(), "idemgate.sql")
	if err := os.WriteFile(f, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	psqlRun := func() (string, error) {
		out, err := exec.Command(psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", f, bySQL).CombinedOutput()
		return string(out), err
	}
	if out, err := psqlRun(); err != nil {
		t.Fatalf("psql -f: %v\n%s", err, out)
	}
	once := describeSchema(t, bySQL, schema)
	// The second run is refused (docs/operations.md), says what to run,
	// and leaves the schema as it was.
	if out, err := psqlRun(); err == nil || !strings.Contains(out, "is applied already: run only the versions after the newest applied one") {
		t.Fatalf("psql -f a second time: %v\n%s; want a refusal", err, out)
	}
	if got := describeSchema(t, bySQL, schema); got != once {
		t.Fatalf("the refused second run changed the schema:\n%s\nwas\n%s", got, once)
	}
	// What the refusal points at: -pending, applied, is a no-op.
	pending := must(t, 0, []string{"DATABASE_URL=" + bySQL}, "migrate", "sql", "-pending", "-schema", schema).stdout
	if err := os.WriteFile(f, []byte(pending), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := psqlRun(); err != nil {
		t.Fatalf("psql -f of sql -pending: %v\n%s", err, out)
	}
	if got := describeSchema(t, bySQL, schema); got != once {
		t.Fatalf("sql -pending on a current schema changed it:\n%s\nwas\n%s", got, once)
	}
	if a := describeSchema(t, byUp, schema); a != once || !strings.Contains(a, "idemgate_records_migrations:1") {
		t.Fatalf("migrate up -schema:\n%s\nmigrate sql -schema | psql:\n%s", a, once)
	}
	if got := describe(t, bySQL); got != "" {
		t.Fatalf("the script wrote outside its schema, in public:\n%s", got)
	}
	must(t, 0, []string{"DATABASE_URL=" + bySQL}, "migrate", "status", "-check", "-schema", schema)
}

// A migration tool applies "migrate sql -schema S -json" chunk by chunk,
// each in a session of its own: every chunk names S itself, so the
// schema is the one "migrate up -schema S" makes and public stays empty,
// also for a name that needs quoting (capitals, a space, a quote).
func TestMigrateSQLJSONChunksEachTargetTheSchema(t *testing.T) {
	t.Parallel()
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("no psql")
	}
	const schema = `Billing "EU" 1`
	byUp, byChunks := testenv.PostgresDSN(t), testenv.PostgresDSN(t)
	for _, dsn := range []string{byUp, byChunks} {
		if _, err := pool(t, dsn).Exec(context.Background(), "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
			t.Fatal(err)
		}
	}
	must(t, 0, []string{"DATABASE_URL=" + byUp}, "migrate", "up", "-schema", schema)
	var chunks []struct {
		Package string
		Version int
		SQL     string
	}
	r := must(t, 0, nil, "migrate", "sql", "-schema", schema, "-json")
	if err := json.Unmarshal([]byte(r.stdout), &chunks); err != nil || len(chunks) < 4 {
		t.Fatalf("sql -json: %v\n%.2000s", err, r.stdout)
	}
	f := filepath.Join(t.TempDir(), "chunk.sql")
	for _, c := range chunks {
		if err := os.WriteFile(f, []byte(c.SQL), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", f, byChunks).CombinedOutput(); err != nil {
			t.Fatalf("psql -f %s v%d: %v\n%s", c.Package, c.Version, err, out)
		}
	}
	if got := describe(t, byChunks); got != "" {
		t.Fatalf("the chunks migrated public, not %s:\n%.1500s", schema, got)
	}
	if a, b := describeSchema(t, byUp, schema), describeSchema(t, byChunks, schema); a != b {
		t.Fatalf("migrate up -schema:\n%s\nsql -json chunks:\n%s", a, b)
	}
}
