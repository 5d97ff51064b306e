package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/pgstore"
)

// TestSubmitWhilePostgresDown: a submit that cannot reach Postgres gets a
// retryable 503 task_store_unavailable, and the claim is released so that
// the retry under the same key runs again instead of hearing "in progress".
func TestSubmitWhilePostgresDown(t *testing.T) {
	t.Parallel()
	e, token := apiWithoutPostgres(t)

	for attempt := 1; attempt <= 2; attempt++ {
		req := httptest.NewRequest(http.MethodPost, "/v1/images",
			strings.NewReader(`{"prompt":"a lighthouse","aspect_ratio":"16:9","n":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Idempotency-Key", "poster:outage")
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		var p struct{ Code string }
		_ = json.Unmarshal(rec.Body.Bytes(), &p)
		if rec.Code != http.StatusServiceUnavailable || p.Code != "task_store_unavailable" {
			t.Fatalf("attempt %d: %d %s, want 503 task_store_unavailable", attempt, rec.Code, rec.Body)
		}
		if rec.Header().Get("Retry-After") == "" {
			t.Errorf("attempt %d: 503 without Retry-After", attempt)
		}
	}
}

// TestReadWhilePostgresDown: polling, cancelling or recovering a task while
// Postgres is out of reach is a retryable 503 task_store_unavailable with
// Retry-After, never a bare 500 (the chaos soak saw 500s on GET during
// Postgres faults).
func TestReadWhilePostgresDown(t *testing.T) {
	t.Parallel()
	e, token := apiWithoutPostgres(t)

	for _, tc := range []struct{ method, path, key string }{
		{http.MethodGet, "/v1/tasks/5b797f1b-1d98-4eb5-a415-10895e7f6ca7", ""},
		{http.MethodPost, "/v1/tasks/5b797f1b-1d98-4eb5-a415-10895e7f6ca7/cancel", ""},
		{http.MethodPost, "/v1/tasks/5b797f1b-1d98-4eb5-a415-10895e7f6ca7/recover", "recover:outage"},
	} {
		req := httptest.NewRequest(tc.method, tc.path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		if tc.key != "" {
			req.Header.Set("Idempotency-Key", tc.key)
		}
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		var p struct{ Code string }
		_ = json.Unmarshal(rec.Body.Bytes(), &p)
		if rec.Code != http.StatusServiceUnavailable || p.Code != "task_store_unavailable" {
			t.Errorf("%s %s: %d %s, want 503 task_store_unavailable", tc.method, tc.path, rec.Code, rec.Body)
		}
		if rec.Header().Get("Retry-After") == "" {
			t.Errorf("%s %s: no Retry-After", tc.method, tc.path)
		}
	}
}

// apiWithoutPostgres returns an API node whose task store was migrated and
// then lost its Postgres (the pool is closed), and a token for acme/alice.
func apiWithoutPostgres(t *testing.T) (*echo.Echo, string) {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	store, err := pgstore.New(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { rdb.Close() })
	secret := []byte("s3cret")
	a := &api{store: store, pool: pool, redis: rdb, secret: secret, logger: slog.New(slog.DiscardHandler)}
	e := a.handler()
	token, err := mintToken(secret, "acme", "alice", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pool.Close() // Postgres is now out of reach for this node.
	return e, token
}
