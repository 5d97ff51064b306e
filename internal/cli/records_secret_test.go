package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/internal/testenv"
)

// records show and release take the raw user and request id to derive
// the key, and print them only as digests: not in a refusal, not in an
// error, not in -json, whatever goes wrong.
func TestRecordsNeverPrintTheUserOrRequestID(t *testing.T) {
	t.Parallel()
	const user, request = "user-SECRET-4711", "request-SECRET-0815"
	redisURL := "redis://" + testenv.Redis(t).Addr
	long := strings.Repeat("r", 300) + request
	tests := []struct {
		name  string
		given []string
		env   map[string]string
	}{
		{name: "no record", given: []string{"records", "show", "-store", "redis", "-tenant", "acme", "-user", user, "-request-id", request, "-kind", "images"},
			env: map[string]string{"REDIS_URL": redisURL}},
		{name: "no record, json", given: []string{"records", "-json", "show", "-store", "redis", "-tenant", "acme", "-user", user, "-request-id", request, "-kind", "images"},
			env: map[string]string{"REDIS_URL": redisURL}},
		{name: "release, no record", given: []string{"records", "release", "-yes", "-finished", "-store", "redis", "-tenant", "acme", "-user", user, "-request-id", request, "-kind", "images"},
			env: map[string]string{"REDIS_URL": redisURL}},
		{name: "bad kind", given: []string{"records", "show", "-store", "redis", "-tenant", "acme", "-user", user, "-request-id", request, "-kind", "Bad Kind!"}},
		{name: "no kind", given: []string{"records", "show", "-store", "redis", "-tenant", "acme", "-user", user, "-request-id", request}},
		{name: "request id too long", given: []string{"records", "show", "-json", "-store", "redis", "-tenant", "acme", "-user", user, "-request-id", long, "-kind", "images"}},
		{name: "user too long", given: []string{"records", "show", "-store", "redis", "-tenant", "acme", "-user", strings.Repeat("u", 300) + user, "-request-id", request, "-kind", "images"}},
		{name: "no store", given: []string{"records", "show", "-tenant", "acme", "-user", user, "-request-id", request, "-kind", "images"}},
		{name: "both key and parts", given: []string{"records", "show", "-store", "redis", "-key", "idem:x", "-user", user, "-request-id", request}},
		{name: "redis unreachable", given: []string{"records", "show", "-store", "redis", "-redis-url", "redis://127.0.0.1:1", "-tenant", "acme", "-user", user, "-request-id", request, "-kind", "images"}},
		{name: "postgres unreachable", given: []string{"records", "show", "-store", "postgres", "-database-url", "postgres://127.0.0.1:1/x?connect_timeout=2", "-tenant", "acme", "-user", user, "-request-id", request, "-kind", "images"}},
		{name: "unknown flag", given: []string{"records", "show", "-store", "redis", "-tenant", "acme", "-user", user, "-request-id", request, "-kind", "images", "-bogus"}},
		{name: "stray operand", given: []string{"records", "show", "-store", "redis", "-user", user, request}},
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
			for _, secret := range []string{"SECRET"} {
				if strings.Contains(stdout.String()+stderr.String(), secret) {
					t.Errorf("exit %d printed the raw user or request id:\nstdout: %s\nstderr: %s", code, stdout.String(), stderr.String())
				}
			}
		})
	}
}
