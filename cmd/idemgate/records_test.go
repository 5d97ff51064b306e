package main_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	engine "github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/keyspace"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/redisstore"
)

// recordsBench is a store with records, and the binary pointed at it.
type recordsBench struct {
	store interface {
		engine.Store
		engine.Inspector
	}
	env  []string
	args []string // -store …
}

func redisBench(t *testing.T, url string, client redis.UniversalClient) recordsBench {
	t.Helper()
	t.Cleanup(func() { _ = client.Close() })
	return recordsBench{store: redisstore.New(client), env: []string{"REDIS_URL=" + url}, args: []string{"-store", "redis"}}
}

func postgresBench(t *testing.T) recordsBench {
	t.Helper()
	dsn := testenv.PostgresDSN(t)
	s, err := pgrecords.New(context.Background(), pool(t, dsn))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return recordsBench{store: s, env: []string{"DATABASE_URL=" + dsn}, args: []string{"-store", "postgres"}}
}

// claim claims a fresh key as the middleware would for tenant acme, user
// alice and a random request id, and returns the flags that name it.
func (b recordsBench) claim(t *testing.T) (engine.Token, string, []string) {
	t.Helper()
	request := "req-" + rand.Text()
	k, err := keyspace.Derive("images", keyspace.Scope{Tenant: "Acme Corp", User: "alice@example.com", Request: request})
	if err != nil {
		t.Fatal(err)
	}
	// A stuck claim: a lease of 8 minutes (see engine.Token.ClaimTimes), a minute left: not renewed for 7.
	tok := stuckToken()
	res, err := b.store.Claim(context.Background(), k.String(), engine.ClaimRequest{
		Fingerprint: fingerprint.Fingerprint("v1:" + strings.Repeat("ab", 32)), Owner: k.Owner(), Kind: k.Kind(),
		Lease: time.Minute, Token: tok})
	if err != nil || res.Status != engine.Claimed {
		t.Fatalf("claim: %v %v", res.Status, err)
	}
	flags := append([]string{"-tenant", "Acme Corp", "-user", "alice@example.com", "-request-id", request, "-kind", "images"}, b.args...)
	return tok, k.String(), flags
}

func (b recordsBench) run(t *testing.T, want int, stdin string, args ...string) result {
	t.Helper()
	r := idemgate(t, b.env, stdin, args...)
	if r.code != want {
		t.Fatalf("idemgate %s: want exit %d, got %s", strings.Join(args, " "), want, r)
	}
	return r
}

func TestRecords(t *testing.T) {
	t.Parallel()
	benches := map[string]func(t *testing.T) recordsBench{
		"redis": func(t *testing.T) recordsBench {
			o := testenv.Redis(t)
			return redisBench(t, "redis://"+o.Addr+"/"+itoa(o.DB), redis.NewClient(o))
		},
		"redis cluster": func(t *testing.T) recordsBench {
			addrs := testenv.RedisCluster(t)
			return redisBench(t, "redis://"+strings.Join(addrs, ","), redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs}))
		},
		"postgres": postgresBench,
	}
	for name, newBench := range benches {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := newBench(t)
			ctx := context.Background()
			tok, key, flags := b.claim(t)

			// show: tenant and kind, digests only for user and request id.
			r := b.run(t, 0, "", append([]string{"records", "show"}, flags...)...)
			contains(t, r, "stdout", "tenant:", "Acme%20Corp", "kind:", "images", "claimed", "lease ends:", tok.String(), "sha256:")
			if strings.Contains(r.stdout, "alice") || strings.Contains(r.stdout, "req-") {
				t.Fatalf("show prints the user or the request id:\n%s", r.stdout)
			}
			r = b.run(t, 0, "", append([]string{"records", "-json", "show"}, flags...)...)
			var row map[string]any
			if err := json.Unmarshal([]byte(r.stdout), &row); err != nil || row["state"] != "claimed" || row["token"] != tok.String() || row["key"] != key {
				t.Fatalf("show -json: %v\n%s", err, r)
			}
			// -key names the same record.
			b.run(t, 0, "", append([]string{"records", "show", "-key", key}, b.args...)...)

			// release: refused without a confirmation, the claim stays.
			r = b.run(t, 1, "yes\n", append([]string{"records", "release"}, flags...)...)
			contains(t, r, "stderr", "without a confirmation: pass -yes")
			if _, err := b.store.Inspect(ctx, key); err != nil {
				t.Fatalf("a refused release freed the claim: %v", err)
			}
			r = b.run(t, 0, "", append([]string{"records", "release", "-yes"}, flags...)...)
			contains(t, r, "stdout", "claim released")
			// The request that held it can neither finish nor extend it.
			if err := b.store.Complete(ctx, key, tok, engine.Response{Status: 200}, time.Hour); !errors.Is(err, engine.ErrLeaseLost) {
				t.Fatalf("the released request's Complete = %v, want ErrLeaseLost", err)
			}
			r = b.run(t, 1, "", append([]string{"records", "show"}, flags...)...)
			contains(t, r, "stderr", "no live record")
			b.run(t, 1, "", append([]string{"records", "release", "-yes"}, flags...)...)

			// A finished record needs -finished.
			tok, key, flags = b.claim(t)
			resp := engine.Response{Status: 201, Header: http.Header{"Location": {"/v1/tasks/7"}}, Body: []byte(`{"task_id":"7"}`)}
			if err := b.store.Complete(ctx, key, tok, resp, time.Hour); err != nil {
				t.Fatal(err)
			}
			r = b.run(t, 0, "", append([]string{"records", "show"}, flags...)...)
			contains(t, r, "stdout", "finished", "status:", "201", "Location", "15 bytes", "expires:")
			r = b.run(t, 1, "", append([]string{"records", "release", "-yes"}, flags...)...)
			contains(t, r, "stderr", "Pass -finished")
			r = b.run(t, 0, "", append([]string{"records", "release", "-yes", "-finished", "-json"}, flags...)...)
			if !json.Valid([]byte(r.stdout)) || !strings.Contains(r.stdout, `"released": true`) {
				t.Fatalf("release -json: %s", r)
			}
			if _, err := b.store.Inspect(ctx, key); !errors.Is(err, engine.ErrNoRecord) {
				t.Fatalf("after release -finished: %v", err)
			}
		})
	}
}

// TestRecordsReleaseRefusesAnotherClaim: after a release, the client's
// retry claims the key; the released request's late answer is not stored
// over it, and the same release run again frees nothing (its key is
// another claim's now, and "records show" names the new token).
func TestRecordsReleaseRefusesAnotherClaim(t *testing.T) {
	t.Parallel()
	b := postgresBench(t)
	ctx := context.Background()
	tok, key, flags := b.claim(t)
	b.run(t, 0, "", append([]string{"records", "release", "-yes"}, flags...)...)
	held, err := b.store.Inspect(ctx, key)
	if !errors.Is(err, engine.ErrNoRecord) {
		t.Fatalf("after the release: %+v, %v", held, err)
	}
	owner, kind := keyParts(t, key)
	retry := engine.ClaimRequest{Fingerprint: fingerprint.Fingerprint("v1:" + strings.Repeat("ab", 32)),
		Owner: owner, Kind: kind, Lease: time.Minute}
	_, _ = rand.Read(retry.Token[:])
	if res, err := b.store.Claim(ctx, key, retry); err != nil || res.Status != engine.Claimed {
		t.Fatalf("the retry's claim: %v %v", res.Status, err)
	}
	if err := b.store.Complete(ctx, key, tok, engine.Response{Status: 200, Body: []byte("late")}, time.Hour); !errors.Is(err, engine.ErrLeaseLost) {
		t.Fatalf("the released request's late Complete = %v, want ErrLeaseLost", err)
	}
	r := b.run(t, 0, "", append([]string{"records", "show"}, flags...)...)
	contains(t, r, "stdout", "claimed", retry.Token.String())
}

// keyParts returns the user digest and the kind a keyspace key names.
func keyParts(t *testing.T, key string) (owner, kind string) {
	t.Helper()
	p := strings.Split(key, ":")
	if len(p) != 5 {
		t.Fatalf("not a keyspace key: %q", key)
	}
	return p[3], p[2]
}

// stuckToken returns a token laid out as the middleware makes it (see
// engine.Token.ClaimTimes): claimed 3 minutes ago for a 4-minute lease.
func stuckToken() engine.Token {
	var t engine.Token
	_, _ = rand.Read(t[:])
	binary.BigEndian.PutUint64(t[:8], uint64(time.Now().Add(-3*time.Minute).UnixMilli())<<16|uint64(binary.BigEndian.Uint16(t[6:8])))
	t[6] = 0x80 | t[6]&0x0f
	t[8] = 0x80 | t[8]&0x3f
	binary.BigEndian.PutUint32(t[9:13], uint32((8 * time.Minute).Milliseconds()))
	return t
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}
