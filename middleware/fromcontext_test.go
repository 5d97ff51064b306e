package middleware_test

import (
	"net/http"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/redisstore"
)

// TestFromContextFailOpen: a handler run unprotected because the store is
// down (FailOpen) still finds the key and fingerprint.
func TestFromContextFailOpen(t *testing.T) {
	t.Parallel()
	client := closedRedis(t)
	var got middleware.Request
	var ok bool
	v := newEnvOn(t, nil, client, redisstore.New(client), func(c *middleware.Config) { c.FailOpen = true },
		func(c echo.Context, n int64) error {
			got, ok = middleware.FromContext(c)
			return c.NoContent(http.StatusAccepted)
		})
	if rec := v.do(req{key: "k", body: imageBody}); rec.Code != http.StatusAccepted {
		t.Fatalf("status %d", rec.Code)
	}
	if !ok || got.Key.Kind() != "post-v1-images" || got.Fingerprint == "" {
		t.Errorf("FromContext = %+v, %v", got, ok)
	}
}
