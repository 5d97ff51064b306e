package otelidem_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/otelidem"
	"github.com/idemgate/idemgate/otelidem/internal/sdktest/oteltest"
	"github.com/idemgate/idemgate/redisstore"
)

// txRedis is a TxStore for the test: Redis records, and a "transaction"
// whose Commit completes the record.
type txRedis struct {
	*redisstore.Store
	commits atomic.Int32
}

func (s *txRedis) Begin(context.Context) (idemgate.Tx, error) { return &txRedisTx{s: s}, nil }

type txRedisTx struct{ s *txRedis }

func (t *txRedisTx) Context(ctx context.Context) context.Context { return ctx }
func (t *txRedisTx) Commit(ctx context.Context, c *idemgate.Completion) error {
	t.s.commits.Add(1)
	if c == nil {
		return nil
	}
	return t.s.Complete(ctx, c.Key, c.Token, c.Response, c.Retention)
}
func (t *txRedisTx) Rollback(context.Context) error { return nil }

// A wrapped store that can run Atomic routes still can: Store keeps
// TxStore, and the transaction's begin and commit are spans of the request.
func TestStoreKeepsAtomicRoutes(t *testing.T) {
	b := setup(t, otelidem.Config{})
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	inner := &txRedis{Store: redisstore.New(rdb)}
	wrapped := b.rec.Store(inner)
	if _, ok := wrapped.(idemgate.TxStore); !ok {
		t.Fatalf("Store(%T) = %T: no longer a TxStore", inner, wrapped)
	}
	if _, ok := b.rec.Store(redisstore.New(rdb)).(idemgate.TxStore); ok {
		t.Fatal("a store without transactions must not pretend to have them")
	}
	idem, err := middleware.Config{
		Store:  wrapped,
		Scope:  func(echo.Context) (string, string, error) { return "acme", "alice", nil },
		Atomic: true,
	}.ToMiddleware()
	if err != nil {
		t.Fatalf("Atomic on the wrapped store: %v", err)
	}
	e := echo.New()
	e.Use(b.rec.Server())
	e.POST("/x", func(c echo.Context) error { return c.String(http.StatusCreated, "made") }, idem)
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/x", strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "k1")
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated || rec.Body.String() != "made" {
			t.Fatalf("answer %d %q", rec.Code, rec.Body)
		}
	}
	if n := inner.commits.Load(); n != 1 {
		t.Fatalf("%d commits, want 1 (the retry replays)", n)
	}
	names := oteltest.Names(b.Spans.Ended())
	for _, want := range []string{"idemgate.begin", "idemgate.commit"} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Fatalf("no %s span: %v", want, names)
		}
	}
}
