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
