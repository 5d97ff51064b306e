package middleware_test

import (
	"net/http"
	"testing"

	"github.com/labstack/echo/v4"
	echomw "github.com/labstack/echo/v4/middleware"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/doortest"
	"github.com/idemgate/idemgate/middleware"
)

// TestDoor runs the doors' behaviour suite on echo: the middleware on the
// whole app (e.Use), so that it sees echo's 404s and 405s, inside echo's
// Recover.
func TestDoor(t *testing.T) {
	t.Parallel()
	doortest.Run(t, doortest.Door{New: func(t *testing.T, s doortest.Setup) http.Handler {
		mw, err := echoConfig(s.Config).ToMiddleware()
		if err != nil {
			t.Fatalf("ToMiddleware: %v", err)
		}
		e := echo.New()
		e.Use(echomw.Recover(), mw)
		for _, r := range s.Routes {
			e.Add(r.Method, doortest.ColonPattern(r.Pattern), echo.WrapHandler(r.Handler))
		}
		return e
	}})
}

// echoConfig is the middleware's Config for the suite's.
func echoConfig(c doortest.Config) middleware.Config {
	cfg := middleware.Config{
		Store:            c.Store,
		Scope:            func(ec echo.Context) (string, string, error) { return c.Scope(ec.Request()) },
		Kind:             c.Kind,
		Fingerprint:      c.Fingerprint,
		Header:           c.Header,
		Required:         c.Required,
		Methods:          c.Methods,
		Retention:        c.Retention,
		Lease:            c.Lease,
		WaitInFlight:     c.WaitInFlight,
		MismatchStatus:   c.MismatchStatus,
		Cacheable:        c.Cacheable,
		MaxBodyBytes:     c.MaxBodyBytes,
		MaxResponseBytes: c.MaxResponseBytes,
		ReplayHeaders:    c.ReplayHeaders,
		FailOpen:         c.FailOpen,
		OnEvent:          c.OnEvent,
		Atomic:           c.Atomic,
	}
	if c.Skipper != nil {
		cfg.Skipper = func(ec echo.Context) bool { return c.Skipper(ec.Request()) }
	}
	if c.ErrorHandler != nil {
		cfg.ErrorHandler = func(ec echo.Context, p idemgate.Problem) error {
			c.ErrorHandler(ec.Response(), ec.Request(), p)
			return nil
		}
	}
	return cfg
}
