package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/internal/testenv"
)

func TestParseRedisURL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		given     string
		wantTopo  redisTopology
		wantAddrs []string
		wantDB    int
		wantPass  string
		wantName  string
		wantErr   string
	}{
		{name: "one node", given: "redis://localhost:6379/3", wantTopo: redisSingle, wantAddrs: []string{"localhost:6379"}, wantDB: 3},
		{name: "one node with password", given: "redis://:s3cret@h:1", wantTopo: redisSingle, wantAddrs: []string{"h:1"}, wantPass: "s3cret"},
		{name: "cluster seed list", given: "redis://h1:7000,h2:7001,h3:7002", wantTopo: redisCluster,
			wantAddrs: []string{"h1:7000", "h2:7001", "h3:7002"}},
		{name: "cluster addr params", given: "redis://u:p@h1:7000?addr=h2:7001&addr=h3:7002", wantTopo: redisCluster,
			wantAddrs: []string{"h1:7000", "h2:7001", "h3:7002"}, wantPass: "p"},
		{name: "sentinel", given: "redis://s1:26379,s2:26379?master_name=mymaster", wantTopo: redisSentinel,
			wantAddrs: []string{"s1:26379", "s2:26379"}, wantName: "mymaster"},
		{name: "wrong scheme", given: "http://h:1", wantErr: "scheme"},
		{name: "empty seed", given: "redis://h1:1,,h2:2", wantErr: "empty host"},
		{name: "unknown parameter", given: "redis://h1:1,h2:2?bogus=1", wantErr: "bogus"},
		{name: "not a URL, password not echoed", given: "redis://:pa ss@h:1%", wantErr: "not a URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, topo, err := parseRedisURL(tt.given)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one saying %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "pa ss") || strings.Contains(err.Error(), "s3cret") {
					t.Fatalf("error %q echoes the password", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if topo != tt.wantTopo || strings.Join(o.Addrs, ",") != strings.Join(tt.wantAddrs, ",") ||
				o.DB != tt.wantDB || o.Password != tt.wantPass || o.MasterName != tt.wantName {
				t.Fatalf("got %s %v db=%d pass=%q master=%q", topo, o.Addrs, o.DB, o.Password, o.MasterName)
			}
			// The options choose the same topology in go-redis.
			c := redis.NewUniversalClient(o)
			defer c.Close()
			_, isCluster := c.(*redis.ClusterClient)
			if isCluster != (topo == redisCluster) {
				t.Fatalf("go-redis made a %T for a %s URL", c, topo)
			}
		})
	}
}

func FuzzParseRedisURL(f *testing.F) {
	for _, s := range []string{"redis://h:1/0", "redis://a:1,b:2", "rediss://u:p@a:1?addr=b:2", "redis://s:1?master_name=m", "redis://,", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		o, topo, err := parseRedisURL(s)
		if err != nil {
			return
		}
		if len(o.Addrs) == 0 || topo == "" {
			t.Fatalf("%q: accepted with no address (%s)", s, topo)
		}
		if topo == redisCluster && !o.IsClusterMode {
			t.Fatalf("%q: a cluster URL not in cluster mode", s)
		}
	})
}

// The example runs on a real 3-master Redis Cluster given as REDIS_URL
// seeds: a submit, its replay and a drifted retry answer as on one node
// (no CROSSSLOT: each record is one key).
func TestServeOnRedisCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := "redis://" + strings.Join(testenv.RedisCluster(t), ",")
	b, err := openBackends(ctx, settings{databaseURL: testenv.PostgresDSN(t), redisURL: url}, true, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.close)
	if _, ok := b.redis.(*redis.ClusterClient); !ok {
		t.Fatalf("REDIS_URL %s gave a %T, want a cluster client", url, b.redis)
	}
	secret := []byte("s3cret")
	a := &api{store: b.store, pool: b.pool, redis: b.redis, secret: secret, logger: slog.New(slog.DiscardHandler)}
	e := a.handler()
	tok, err := mintToken(secret, "acme", "alice", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	post := func(body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/v1/images", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "cluster-1")
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		return rec
	}
	body := `{"prompt":"a lighthouse","aspect_ratio":"1:1","n":1}`
	first, again := post(body), post(body)
	drift := post(strings.Replace(body, "lighthouse", "lighthouse ", 1))
	if first.Code != http.StatusAccepted || again.Code != http.StatusAccepted || again.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("submit %d, retry %d (replayed %q): want 202 twice, the second replayed:\n%s",
			first.Code, again.Code, again.Header().Get("Idempotent-Replayed"), again.Body)
	}
	if !bytes.Equal(first.Body.Bytes(), again.Body.Bytes()) {
		t.Fatalf("replay differs:\n%s\n%s", first.Body, again.Body)
	}
	if drift.Code != http.StatusConflict {
		t.Fatalf("drifted retry: %d, want 409:\n%s", drift.Code, drift.Body)
	}
}
