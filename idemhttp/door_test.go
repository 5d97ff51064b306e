package idemhttp_test

import (
	"net/http"
	"os"
	"testing"

	"github.com/idemgate/idemgate/idemhttp"
	"github.com/idemgate/idemgate/internal/doortest"
	"github.com/idemgate/idemgate/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// TestDoor runs the doors' behaviour suite on idemhttp and Go's ServeMux,
// the middleware wrapping each route's handler (the recipe the package
// documents), so that the mux's own 404 and 405 never reach it.
func TestDoor(t *testing.T) {
	t.Parallel()
	doortest.Run(t, doortest.Door{New: func(t *testing.T, s doortest.Setup) http.Handler {
		mw, err := httpConfig(s.Config).ToMiddleware()
		if err != nil {
			t.Fatalf("ToMiddleware: %v", err)
		}
		mux := http.NewServeMux()
		for _, r := range s.Routes {
			mux.Handle(r.Method+" "+r.Pattern, mw(r.Handler))
		}
		return mux
	}})
}

// TestDoorWrappingTheWholeMux runs the suite with the middleware around
// the whole ServeMux, before it routes: the path is the target, and the
// mux's own 404 and 405 pass through untouched.
func TestDoorWrappingTheWholeMux(t *testing.T) {
	t.Parallel()
	doortest.Run(t, doortest.Door{New: func(t *testing.T, s doortest.Setup) http.Handler {
		mw, err := httpConfig(s.Config).ToMiddleware()
		if err != nil {
			t.Fatalf("ToMiddleware: %v", err)
		}
		mux := http.NewServeMux()
		for _, r := range s.Routes {
			mux.Handle(r.Method+" "+r.Pattern, r.Handler)
		}
		return mw(mux)
	}})
}

// httpConfig is idemhttp's Config for the suite's.
func httpConfig(c doortest.Config) idemhttp.Config {
	return idemhttp.Config{
		Skipper:          c.Skipper,
		Store:            c.Store,
		Scope:            c.Scope,
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
		ErrorHandler:     c.ErrorHandler,
		Atomic:           c.Atomic,
	}
}
