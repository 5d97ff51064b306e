package middleware_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	echomw "github.com/labstack/echo/v4/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/redisstore"
)

// TestDecompressOutside: echo's Decompress outside the middleware
// (e.Use(Decompress) before it) hands over the decoded body while
// Content-Length still counts the gzip bytes: every gzip request was 400
// (decoded shorter) or 413 (decoded longer).
func TestDecompressOutside(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	e := echo.New()
	e.Use(echomw.Decompress())
	e.Use(middleware.New(middleware.Config{Store: redisstore.New(client), Scope: testScope, Fingerprint: fingerprint.Spec{Fields: []string{"/prompt"}}}))
	e.POST("/v1/tasks", func(c echo.Context) error {
		var got struct {
			Prompt string `json:"prompt"`
		}
		if err := c.Bind(&got); err != nil {
			return err
		}
		return c.JSON(http.StatusCreated, got)
	})
	for i, body := range []string{`{"prompt":"a"}`, `{"prompt":"` + strings.Repeat("a lighthouse ", 200) + `"}`} {
		z := gzipped(t, body)
		for try := range 2 {
			r := httptest.NewRequest(http.MethodPost, "/v1/tasks", bytes.NewReader(z))
			r.Header.Set("Content-Encoding", "gzip")
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Idempotency-Key", "k"+string(rune('a'+i)))
			r.Header.Set("X-Tenant", "acme")
			r.Header.Set("X-User", "alice")
			rec := httptest.NewRecorder()
			e.ServeHTTP(rec, r)
			if rec.Code != http.StatusCreated || (try == 1) != (rec.Header().Get("Idempotent-Replayed") == "true") {
				t.Errorf("gzip body of %d bytes (%d compressed), try %d = %d %s, want 201 (a replay on the retry)", len(body), len(z), try, rec.Code, rec.Body)
			}
		}
	}
}

// TestPreRouting: the middleware registered with e.Pre runs before
// routing: no route template, no path parameters. /v1/orders/1/refund and
// /v1/orders/2/refund under one key were replayed each other's answer.
func TestPreRouting(t *testing.T) {
	t.Parallel()
	type refund struct {
		ID     string `param:"id"`
		Amount int    `json:"amount"`
	}
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	v := &env{e: echo.New(), mr: mr, client: client, store: redisstore.New(client), events: &recorder{}}
	v.e.Pre(middleware.New(middleware.Config{Store: v.store, Scope: testScope}))
	v.e.POST("/v1/orders/:id/refund", func(c echo.Context) error {
		var got refund
		if err := c.Bind(&got); err != nil {
			return err
		}
		return c.JSON(http.StatusCreated, got)
	})
	checkNoFalseReplay[refund](t, v,
		req{path: "/v1/orders/1/refund", key: "k", body: `{"amount":5}`},
		req{path: "/v1/orders/2/refund", key: "k", body: `{"amount":5}`})
}
