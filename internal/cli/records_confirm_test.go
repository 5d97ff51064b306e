package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/keyspace"
	"github.com/idemgate/idemgate/redisstore"
)

// At a terminal, records release goes on only on the answer "yes": an
// empty line, end of input, "y", "YES" or "yes please" change nothing.
// Without a terminal it never reads stdin: -yes is the way to confirm.
// With -json, stdout holds only the final JSON, the question goes to
// stderr.
func TestRecordsReleaseConfirmation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	opts := testenv.Redis(t)
	client := redis.NewClient(opts)
	t.Cleanup(func() { client.Close() })
	store := redisstore.New(client)
	redisURL := fmt.Sprintf("redis://%s/%d", opts.Addr, opts.DB)
	if opts.Password != "" || opts.Username != "" {
		t.Skip("test Redis needs credentials")
	}
	claim := func(t *testing.T, request string) keyspace.Key {
		t.Helper()
		k, err := keyspace.Derive("images", keyspace.Scope{Tenant: "acme", User: "alice", Request: request})
		if err != nil {
			t.Fatal(err)
		}
		// A stuck claim: made 3 minutes ago for 4, a minute left.
		res, err := store.Claim(ctx, k.String(), idemgate.ClaimRequest{
			Fingerprint: fingerprint.Fingerprint("v1:" + strings.Repeat("ab", 32)), Owner: k.Owner(), Kind: k.Kind(),
			Lease: time.Minute, Token: claimToken(time.Now().Add(-3*time.Minute), 8*time.Minute)})
		if err != nil || res.Status != idemgate.Claimed {
			t.Fatalf("claim: %v %v", res.Status, err)
		}
		return k
	}
	tests := []struct {
		name         string
		terminal     bool
		stdin        string
		json         bool
		wantReleased bool
	}{
		{name: "empty line", terminal: true, stdin: "\n"},
		{name: "end of input", terminal: true, stdin: ""},
		{name: "y", terminal: true, stdin: "y\n"},
		{name: "YES", terminal: true, stdin: "YES\n"},
		{name: "yes please", terminal: true, stdin: "yes please\n"},
		{name: "no terminal, yes on stdin", terminal: false, stdin: "yes\n"},
		{name: "yes", terminal: true, stdin: "yes\n", wantReleased: true},
		{name: "yes, json", terminal: true, stdin: " yes \n", json: true, wantReleased: true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			request := "confirm-" + string(rune('a'+i))
			k := claim(t, request)
			args := []string{"records", "release", "-store", "redis", "-tenant", "acme", "-user", "alice", "-request-id", request, "-kind", "images"}
			if tt.json {
				args = append(args, "-json")
			}
			var stdout, stderr bytes.Buffer
			env := Env{Prog: "idemgate", Getenv: func(k string) string {
				if k == "REDIS_URL" {
					return redisURL
				}
				return ""
			}, Stdin: strings.NewReader(tt.stdin), Stdout: &stdout, Stderr: &stderr, StdinIsTerminal: tt.terminal}
			code := Main(ctx, args, env)
			_, err := store.Inspect(ctx, k.String())
			released := errors.Is(err, idemgate.ErrNoRecord)
			if released != tt.wantReleased || (code == ExitOK) != tt.wantReleased {
				t.Fatalf("exit %d, released %v (%v); want released %v\nstdout: %s\nstderr: %s", code, released, err, tt.wantReleased, stdout.String(), stderr.String())
			}
			if tt.json {
				var v struct{ Released bool }
				if err := json.Unmarshal(stdout.Bytes(), &v); err != nil || !v.Released {
					t.Errorf("-json stdout is not the one JSON answer: %v\n%s", err, stdout.String())
				}
			}
		})
	}
}
