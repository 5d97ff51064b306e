package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// An on-call engineer who passes the connection string as an operand
// (idemgate migrate status $DATABASE_URL) or in a verb's place gets bad
// usage that does not print it back: it holds the password.
func TestAConnectionStringGivenAsAnOperandIsNotEchoed(t *testing.T) {
	t.Parallel()
	const pg, rd, kv = "postgres://u:hunter2@127.0.0.1:1/x", "rediss://:hunter2@h:6380/0", "host=h password=hunter2"
	for _, given := range [][]string{
		{pg, "migrate"},
		{"migrate", pg, "status"},
		{"migrate", "status", pg},
		{"migrate", "sql", kv},
		{"records", rd, "show"},
		{"tasks", kv, "list"},
		{"tasks", "list", pg},
		{"tasks", "pause", kv, "-new-kind"},
	} {
		t.Run(strings.Join(given[:2], " "), func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			env := Env{Prog: "idemgate", Getenv: func(string) string { return "" }, Stdin: strings.NewReader(""),
				Stdout: &stdout, Stderr: &stderr}
			code := Main(context.Background(), given, env)
			out := stdout.String() + stderr.String()
			if strings.Contains(out, "hunter2") {
				t.Errorf("%q: exit %d printed the secret:\n%s", given, code, out)
			}
			if code != ExitUsage {
				t.Errorf("%q: exit %d, want %d\n%s", given, code, ExitUsage, out)
			}
		})
	}
}
