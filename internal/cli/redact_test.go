package cli

import (
	"bytes"
	"cmp"
	"context"
	"strings"
	"testing"
)

// A connection string may carry a secret in its user info, in a query
// parameter (password=, sslpassword=; Sentinel's password=) or as a
// key=value pair; a command that cannot connect names the server it
// tried, never the secret.
func TestConnectionErrorsNeverPrintASecret(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		given []string
		env   map[string]string
	}{
		{name: "postgres URL, password parameter", given: []string{"migrate", "status"},
			env: map[string]string{"DATABASE_URL": "postgres://alice@127.0.0.1:1/x?password=hunter2&connect_timeout=2"}},
		{name: "postgres URL, sslpassword parameter", given: []string{"migrate", "status"},
			env: map[string]string{"DATABASE_URL": "postgres://alice:hunter2@127.0.0.1:1/x?sslpassword=hunter2&connect_timeout=2"}},
		{name: "postgres URL, upper-case parameter", given: []string{"tasks", "list"},
			env: map[string]string{"DATABASE_URL": "postgresql://127.0.0.1:1/x?connect_timeout=2&Password=hunter2"}},
		{name: "postgres key=value", given: []string{"migrate", "status"},
			env: map[string]string{"DATABASE_URL": "host=127.0.0.1 port=1 dbname=x password=hunter2 connect_timeout=2"}},
		{name: "postgres key=value, quoted", given: []string{"migrate", "status"},
			env: map[string]string{"DATABASE_URL": "host=127.0.0.1 port=1 password='hunter2 x' sslpassword = 'hunter2' connect_timeout=2"}},
		{name: "postgres URL that does not parse", given: []string{"migrate", "status"},
			env: map[string]string{"DATABASE_URL": "postgres://alice:hunter2@127.0.0.1:port/x?password=hunter2"}},
		{name: "postgres flag", given: []string{"migrate", "status", "-database-url", "postgres://127.0.0.1:1/x?password=hunter2&connect_timeout=2"}},
		{name: "redis URL, user info", given: []string{"records", "show", "-store", "redis", "-key", "k"},
			env: map[string]string{"REDIS_URL": "redis://alice:hunter2@127.0.0.1:1/0?dial_timeout=1s"}},
		{name: "sentinel URL, password parameter", given: []string{"records", "show", "-store", "redis", "-key", "k"},
			env: map[string]string{"REDIS_URL": "redis://127.0.0.1:1?master_name=m&password=hunter2&dial_timeout=1s"}},
		{name: "cluster URL, user info", given: []string{"records", "show", "-store", "redis", "-key", "k"},
			env: map[string]string{"REDIS_URL": "redis://:hunter2@127.0.0.1:1,127.0.0.1:2?dial_timeout=1s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			env := Env{Prog: "idemgate", Getenv: func(k string) string { return tt.env[k] }, Stdin: strings.NewReader(""),
				Stdout: &stdout, Stderr: &stderr}
			code := Main(context.Background(), tt.given, env)
			if code == ExitOK {
				t.Fatalf("exit 0; want a failure\n%s%s", stdout.String(), stderr.String())
			}
			if out := stdout.String() + stderr.String(); strings.Contains(out, "hunter2") {
				t.Errorf("exit %d printed the secret:\n%s", code, out)
			}
		})
	}
}

// A password holding a '/', '?' or '#' that was not percent-encoded ends
// a URL's user info early: pgx then reads a URL with no password whose
// host is the user name and whose database (or parameter) is the rest of
// the password, and the connection error printed both. Such a URL is bad
// usage, refused before any connection, and not echoed. (pgx reads a
// postgres:// URL's user info as libpq does, up to an '@' before any '/':
// a '?' in its password is read as part of it, and the connection tried.)
func TestAPasswordWithAnUnencodedSlashQuestionMarkOrHashNeverShows(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		given    []string
		env      map[string]string
		wantCode int // 0: ExitUsage
	}{
		{name: "postgres, password starts with /", given: []string{"migrate", "status"},
			env: map[string]string{"DATABASE_URL": "postgres://alice:/hunter2@127.0.0.1:1/x?connect_timeout=2"}},
		{name: "postgres, digits then /", given: []string{"tasks", "list", "-json"},
			env: map[string]string{"DATABASE_URL": "postgresql://alice:12/hunter2@127.0.0.1:1/x?connect_timeout=2"}},
		{name: "postgres, digits then ?", given: []string{"migrate", "status"},
			env: map[string]string{"DATABASE_URL": "postgres://alice:12?hunter2@127.0.0.1:1/x"}, wantCode: ExitError},
		{name: "postgres, digits, / then ?", given: []string{"migrate", "status"},
			env: map[string]string{"DATABASE_URL": "postgres://alice:1/hunter2?b=c@127.0.0.1:1/x"}},
		{name: "postgres, an IAM user's e-mail in user= is no password", given: []string{"migrate", "status"},
			env: map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/x?user=alice@example.com&password=hunter2&connect_timeout=2"}, wantCode: ExitError},
		{name: "postgres flag, host list", given: []string{"migrate", "status", "-database-url", "postgres://alice:12/hunter2@127.0.0.1:1,127.0.0.1:2/x"}},
		{name: "redis, digits then /", given: []string{"records", "show", "-store", "redis", "-key", "k"},
			env: map[string]string{"REDIS_URL": "redis://:12/hunter2@127.0.0.1:1"}},
		{name: "redis, digits then #", given: []string{"records", "show", "-store", "redis", "-key", "k"},
			env: map[string]string{"REDIS_URL": "rediss://:12#hunter2@127.0.0.1:1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			env := Env{Prog: "idemgate", Getenv: func(k string) string { return tt.env[k] }, Stdin: strings.NewReader(""),
				Stdout: &stdout, Stderr: &stderr}
			code := Main(context.Background(), tt.given, env)
			out := stdout.String() + stderr.String()
			if strings.Contains(out, "hunter2") {
				t.Errorf("exit %d printed the secret:\n%s", code, out)
			}
			if want := cmp.Or(tt.wantCode, ExitUsage); code != want {
				t.Errorf("exit %d, want %d\n%s", code, want, out)
			}
		})
	}
}
