package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/testenv"
)

// migrate status -check passes only a schema this idemgate knows all of:
// one that a newer idemgate migrated further (a version this one does
// not know) fails it, saying so; a current one passes.
func TestMigrateStatusCheckFailsASchemaNewerThanTheBinary(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.PostgresDSN(t)
	run := func(args ...string) (int, string, string) {
		var stdout, stderr strings.Builder
		env := Env{Prog: "idemgate", Getenv: func(k string) string {
			if k == "DATABASE_URL" {
				return dsn
			}
			return ""
		}, Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr}
		return Main(ctx, args, env), stdout.String(), stderr.String()
	}
	if code, _, stderr := run("migrate", "up"); code != ExitOK {
		t.Fatalf("migrate up: exit %d: %s", code, stderr)
	}
	if code, _, stderr := run("migrate", "status", "-check"); code != ExitOK {
		t.Fatalf("status -check on a current schema: exit %d: %s", code, stderr)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `INSERT INTO idemgate_records_migrations (version, name) VALUES (99, 'a newer idemgate''s')`); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := run("migrate", "status", "-check")
	if code != ExitError || !strings.Contains(stderr, "newer") || !strings.Contains(stderr, "pgrecords") {
		t.Fatalf("status -check on a schema a newer idemgate migrated: exit %d; want 1 saying so\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	if code, _, _ := run("migrate", "status", "-check", "-package", "pgstore"); code != ExitOK {
		t.Fatalf("status -check -package pgstore: exit %d; pgstore is current", code)
	}
}
