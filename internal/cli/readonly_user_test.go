package cli

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/pgrecords"
)

// An operator on call may hold only a read-only database user. Every
// command that only reads must then work: one that took a lock, created
// a table or wrote a version row would fail with "permission denied".
func TestReadOnlyCommandsRunAsAReadOnlyUser(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newOpsBench(t)
	records, err := pgrecords.New(ctx, o.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := records.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	role := fmt.Sprintf("idemgate_ro_%d", time.Now().UnixNano())
	var schema string
	if err := o.Pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"CREATE ROLE " + role + " LOGIN PASSWORD 'ro'",
		"GRANT USAGE ON SCHEMA " + pgx.Identifier{schema}.Sanitize() + " TO " + role,
		"GRANT SELECT ON ALL TABLES IN SCHEMA " + pgx.Identifier{schema}.Sanitize() + " TO " + role,
	} {
		if _, err := o.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		_, _ = o.Pool.Exec(context.Background(), "REASSIGN OWNED BY "+role+" TO CURRENT_USER")
		_, _ = o.Pool.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = o.Pool.Exec(context.Background(), "DROP ROLE "+role)
	})
	u, err := url.Parse(o.DSN)
	if err != nil || u.Scheme == "" {
		t.Skipf("the test DSN is not a URL (%v): %s", err, o.DSN)
	}
	u.User = url.UserPassword(role, "ro")
	dsn := u.String()

	tests := []struct {
		given    []string
		wantCode int
	}{
		{given: []string{"tasks", "list"}},
		{given: []string{"tasks", "list", "-json", "-tenant", "acme"}},
		{given: []string{"tasks", "show", o.IDs[0]}},
		{given: []string{"tasks", "show", "00000000-0000-0000-0000-000000000000"}, wantCode: ExitError},
		{given: []string{"tasks", "limits", "images"}},
		{given: []string{"migrate", "status"}},
		{given: []string{"migrate", "status", "-check", "-json"}},
		{given: []string{"migrate", "sql", "-pending"}},
		{given: []string{"records", "show", "-store", "postgres", "-tenant", "acme", "-user", "u", "-request-id", "r", "-kind", "images"}, wantCode: ExitError},
	}
	run := func(args []string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		getenv := func(k string) string {
			if k == "DATABASE_URL" {
				return dsn
			}
			return ""
		}
		code := Main(ctx, args, Env{Prog: "idemgate", Getenv: getenv, Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr})
		return code, stdout.String(), stderr.String()
	}
	// The user is read-only indeed: a command that writes is refused.
	if code, _, stderr := run([]string{"tasks", "pause", "images"}); code != ExitError || !strings.Contains(stderr, "permission denied") {
		t.Fatalf("tasks pause as the read-only user: exit %d, %s; want permission denied", code, stderr)
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.given, " "), func(t *testing.T) {
			code, stdout, stderr := run(tt.given)
			if code != tt.wantCode || strings.Contains(stderr, "permission denied") {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.wantCode, stdout, stderr)
			}
		})
	}
}
