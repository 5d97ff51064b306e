package middleware_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	idem "github.com/idemgate/idemgate/middleware"
)

// A team whose API answers every error in its own envelope renders the
// middleware's problems in it too. The retry hint goes out as a header
// either way, for generated clients that obey it.
func ExampleConfig_errorHandler() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	type apiError struct {
		Type      string `json:"type"`
		Message   string `json:"message"`
		Retryable bool   `json:"retryable"`
	}
	e := echo.New()
	e.POST("/v1/charges", func(c echo.Context) error {
		return c.JSON(http.StatusCreated, map[string]string{"id": "ch_1"})
	}, idem.New(idem.Config{
		Store: idem.NewRedisStore(rdb),
		Scope: func(echo.Context) (string, string, error) { return "acme", "alice", nil }, // stand-in for your auth
		ErrorHandler: func(c echo.Context, p idem.Problem) error {
			return c.JSON(p.Status, map[string]apiError{"error": {
				Type: "idempotency_" + string(p.Code), Message: p.Detail, Retryable: p.Code.Retryable()}})
		},
	}))

	for _, body := range []string{`{"amount":100}`, `{"amount":900}`} {
		req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "order-42")
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("X-Should-Retry"), strings.TrimSpace(rec.Body.String()))
	}
	// Output:
	// 201  {"id":"ch_1"}
	// 409 false {"error":{"type":"idempotency_key_reused","message":"This idempotency key was already used with other request parameters. Send a new key for new parameters.","retryable":false}}
}

// requestIDKey is the context key of the request id that the service's
// own middleware sets (a trace's span context works the same way).
type requestIDKey struct{}

// OnEvent gets the request's context, so a log line or a metric carries
// what the request's own middleware put there: a request id, a trace span
// (otelidem records its metrics with it, for exemplars), a request-scoped
// logger.
func ExampleConfig_onEvent() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	e := echo.New()
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc { // the service's request id middleware
		return func(c echo.Context) error {
			r := c.Request()
			c.SetRequest(r.WithContext(context.WithValue(r.Context(), requestIDKey{}, r.Header.Get("X-Request-Id"))))
			return next(c)
		}
	})
	e.Use(idem.New(idem.Config{
		Store: idem.NewRedisStore(rdb),
		Scope: func(echo.Context) (string, string, error) { return "acme", "alice", nil }, // stand-in for your auth
		OnEvent: func(ctx context.Context, ev idem.Event) {
			fmt.Printf("request %v: %s %s\n", ctx.Value(requestIDKey{}), ev.Type, ev.Route)
		},
	}))
	e.POST("/v1/charges", func(c echo.Context) error {
		return c.JSON(http.StatusCreated, map[string]string{"id": "ch_1"})
	})

	for _, id := range []string{"req-1", "req-2"} {
		req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "order-42")
		req.Header.Set("X-Request-Id", id)
		e.ServeHTTP(httptest.NewRecorder(), req)
	}
	// Output:
	// request req-1: claimed POST /v1/charges
	// request req-2: replayed POST /v1/charges
}
