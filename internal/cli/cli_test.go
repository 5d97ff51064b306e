package cli

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
)

// A cron job's or a CI step's stdin is the null device, a character
// device like a terminal; a confirmation must not be asked of it (it
// reads nothing), and "-yes" is then the way to confirm.
func TestStdinIsTerminalNotTheNullDevice(t *testing.T) {
	t.Parallel()
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	for name, f := range map[string]*os.File{"null device": null, "pipe": r} {
		if StdinIsTerminal(f) {
			t.Errorf("%s: a terminal", name)
		}
	}
}

// Flags may come before the verb; one that takes no value must not take
// the verb for its value.
func TestVerbAfterFlags(t *testing.T) {
	t.Parallel()
	env := Env{Stdout: io.Discard, Stderr: io.Discard}
	tests := []struct {
		name    string
		given   []string
		want    string
		wantPre []string
	}{
		{"bool", []string{"-json", "list"}, "list", []string{"-json"}},
		{"bool, another", []string{"-new-kind", "pause", "video"}, "pause", []string{"-new-kind"}},
		{"valued", []string{"-schema", "billing", "list"}, "list", []string{"-schema", "billing"}},
		{"valued with =", []string{"-schema=billing", "-check", "status"}, "status", []string{"-schema=billing", "-check"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, pre, _, err := verb(tt.given, "usage", env)
			if err != nil || got != tt.want || strings.Join(pre, " ") != strings.Join(tt.wantPre, " ") {
				t.Fatalf("verb(%q) = %q, %q, %v; want %q, %q", tt.given, got, pre, err, tt.want, tt.wantPre)
			}
		})
	}
}

// A REDIS_URL or DATABASE_URL that cannot be what was meant (a cluster
// URL naming a database, a string that does not parse) is bad usage,
// exit 2, said before any connection is tried.
func TestAURLThatCannotBeMeantIsBadUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		given   []string
		env     map[string]string
		wantSay string
	}{
		{name: "cluster with a database", given: []string{"records", "show", "-store", "redis", "-key", "k"},
			env: map[string]string{"REDIS_URL": "redis://127.0.0.1:1,127.0.0.1:2/3"}, wantSay: "only database 0"},
		{name: "redis, wrong scheme", given: []string{"records", "show", "-store", "redis", "-key", "k"},
			env: map[string]string{"REDIS_URL": "http://127.0.0.1:1"}, wantSay: "REDIS_URL"},
		{name: "postgres, does not parse", given: []string{"migrate", "status"},
			env: map[string]string{"DATABASE_URL": "postgres://127.0.0.1:port/x"}, wantSay: "DATABASE_URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr strings.Builder
			env := Env{Prog: "idemgate", Getenv: func(k string) string { return tt.env[k] }, Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr}
			if code := Main(context.Background(), tt.given, env); code != ExitUsage || !strings.Contains(stderr.String(), tt.wantSay) {
				t.Fatalf("exit %d; want 2 saying %q\n%s", code, tt.wantSay, stderr.String())
			}
		})
	}
}
