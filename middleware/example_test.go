package middleware_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/fingerprint"
	idem "github.com/idemgate/idemgate/middleware"
)

// authenticate stands in for the service's auth middleware (echo-jwt, a
// session, an API key): it puts the caller's tenant and user in the context.
// Here the caller names them in a header; never do that in a real service.
func authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		tenant, user, ok := strings.Cut(c.Request().Header.Get("X-Demo-Caller"), "/")
		if !ok {
			return echo.ErrUnauthorized
		}
		c.Set("tenant", tenant)
		c.Set("user", user)
		return next(c)
	}
}

// scopeFromAuth reads tenant and user from what the auth middleware put in
// the context.
func scopeFromAuth(c echo.Context) (tenant, user string, err error) {
	tenant, _ = c.Get("tenant").(string)
	user, _ = c.Get("user").(string)
	if tenant == "" || user == "" {
		return "", "", echo.ErrUnauthorized
	}
	return tenant, user, nil
}

// A per-route setup: authentication runs first, then the idempotency
// middleware with the route's kind and fingerprint fields. client_note is not
// a parameter, so changing it still replays; changing the prompt is refused.
func Example() {
	mr, _ := miniredis.Run() // use your Redis: redis.NewClient(&redis.Options{Addr: ...})
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	e := echo.New()
	e.Use(authenticate)

	images := idem.Config{
		Store:       idem.NewRedisStore(rdb),
		Scope:       scopeFromAuth,
		Kind:        "image",
		Fingerprint: fingerprint.Spec{Fields: []string{"/prompt", "/aspect_ratio", "/n"}},
		Required:    true,
		Lease:       30 * time.Second,
		Retention:   24 * time.Hour,
	}
	runs := 0
	e.POST("/v1/images", func(c echo.Context) error {
		runs++
		return c.JSON(http.StatusAccepted, map[string]any{"task_id": fmt.Sprintf("task-%d", runs)})
	}, idem.New(images))

	post := func(key, body string) {
		req := httptest.NewRequest(http.MethodPost, "/v1/images", strings.NewReader(body))
		req.Header.Set("X-Demo-Caller", "acme/alice")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("Idempotent-Replayed"), strings.TrimSpace(rec.Body.String()))
	}
	post("settlement:order-7:image", `{"prompt":"a red fox","aspect_ratio":"16:9","n":1,"client_note":"first"}`)
	post("settlement:order-7:image", `{"n":1,"prompt":"a red fox","aspect_ratio":"16:9","client_note":"retry"}`)
	post("settlement:order-7:image", `{"prompt":"a red fox, reworded","aspect_ratio":"16:9","n":1}`)
	fmt.Println("handler runs:", runs)
	// Output:
	// 202  {"task_id":"task-1"}
	// 202 true {"task_id":"task-1"}
	// 409  {"type":"https://github.com/idemgate/idemgate#key_reused","title":"Idempotency key reused","status":409,"detail":"This idempotency key was already used with other request parameters. Send a new key for new parameters.","code":"key_reused","changed":["/prompt"]}
	// handler runs: 1
}

// A group-level setup: every POST and PATCH in the group is protected; each
// route gets its own kind, derived from its method and path, so the same
// request id on two routes never collides.
func Example_group() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	e := echo.New()
	api := e.Group("/v1", idem.New(idem.Config{
		Store: idem.NewRedisStore(rdb),
		Scope: func(c echo.Context) (string, string, error) {
			// Normally read from the auth middleware's context.
			return "acme", c.Request().Header.Get("X-User"), nil
		},
		WaitInFlight: 2 * time.Second,
	}))
	api.POST("/orders", func(c echo.Context) error {
		r, _ := idem.FromContext(c)
		return c.String(http.StatusCreated, "order for kind "+r.Key.Kind())
	})
	api.POST("/refunds", func(c echo.Context) error {
		r, _ := idem.FromContext(c)
		return c.String(http.StatusCreated, "refund for kind "+r.Key.Kind())
	})

	for _, path := range []string{"/v1/orders", "/v1/refunds", "/v1/orders"} {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader("amount=10"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("X-User", "alice")
		req.Header.Set("Idempotency-Key", "same-id")
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("Idempotent-Replayed"), rec.Body.String())
	}
	// Output:
	// 201  order for kind post-v1-orders
	// 201  refund for kind post-v1-refunds
	// 201 true order for kind post-v1-orders
}

// A handler whose own store (e.g. pgstore.Submit) finds the key held by
// other parameters returns ErrKeyReused and gets the same answer.
func ExampleErrKeyReused() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	e := echo.New()
	e.POST("/v1/tasks", func(c echo.Context) error {
		errConflict := errors.New("pgstore: conflict") // stands in for pgstore.ErrConflict
		return fmt.Errorf("submit: %w: %w", errConflict, idem.ErrKeyReused)
	}, idem.New(idem.Config{
		Store: idem.NewRedisStore(rdb),
		Scope: func(echo.Context) (string, string, error) { return "acme", "alice", nil },
	}))
	req := httptest.NewRequest(http.MethodPost, "/v1/tasks", strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k1")
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, req)
	fmt.Println(rec.Code, rec.Header().Get("Content-Type"))
	// Output:
	// 409 application/problem+json
}
