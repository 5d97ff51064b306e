package routertest

import (
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/idemgate/idemgate/internal/doortest"
)

// chiRoute is idemhttp's Config.Route on chi: the matched route's
// pattern. chi knows it once it has routed, so the middleware goes on the
// routes (r.With, or r.Use inside r.Group), not on the whole router, whose
// middleware runs before routing. chi sets r.PathValue, idemhttp's
// default for the values.
func chiRoute(r *http.Request) string {
	if rc := chi.RouteContext(r.Context()); rc != nil {
		return rc.RoutePattern()
	}
	return ""
}

// chiGroup serves s on chi, the middleware on a route group (r.Use
// inside r.Group).
func chiGroup(t *testing.T, s doortest.Setup) http.Handler {
	cfg := config(s.Config)
	cfg.Route = chiRoute
	mw, err := cfg.ToMiddleware()
	if err != nil {
		t.Fatalf("ToMiddleware: %v", err)
	}
	r := chi.NewRouter()
	r.Group(func(r chi.Router) {
		r.Use(mw)
		for _, rt := range s.Routes {
			r.Method(rt.Method, rt.Pattern, rt.Handler)
		}
	})
	return r
}

// chiWith serves s on chi, the middleware on each route (r.With).
func chiWith(t *testing.T, s doortest.Setup) http.Handler {
	cfg := config(s.Config)
	cfg.Route = chiRoute
	mw, err := cfg.ToMiddleware()
	if err != nil {
		t.Fatalf("ToMiddleware: %v", err)
	}
	r := chi.NewRouter()
	for _, rt := range s.Routes {
		r.With(mw).Method(rt.Method, rt.Pattern, rt.Handler)
	}
	return r
}

// TestChi runs the behaviour suite on chi, the middleware on a route
// group.
func TestChi(t *testing.T) {
	t.Parallel()
	doortest.Run(t, doortest.Door{New: chiGroup})
}

// TestChiWith runs the behaviour suite on chi, the middleware on each
// route.
func TestChiWith(t *testing.T) {
	t.Parallel()
	doortest.Run(t, doortest.Door{New: chiWith})
}

// TestChiRouteAfterRouting: on a route group's middleware chiRoute gives
// the route's pattern, and r.PathValue its parameters; on the router's own
// middleware, which runs before chi routes, it gives no pattern.
func TestChiRouteAfterRouting(t *testing.T) {
	t.Parallel()
	type got struct {
		pattern string
		values  []string
	}
	var inGroup, onRouter got
	record := func(into *got) func(http.Handler) http.Handler {
		return func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				into.pattern = chiRoute(r)
				into.values = []string{r.PathValue("shop"), r.PathValue("id")}
				next.ServeHTTP(w, r)
			})
		}
	}
	r := chi.NewRouter()
	r.Use(record(&onRouter))
	r.Group(func(r chi.Router) {
		r.Use(record(&inGroup))
		r.Post("/v1/shops/{shop}/orders/{id}/refund", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	})
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/shops/s1/orders/7/refund", nil))
	if rec.Code != http.StatusNoContent {
		t.Fatalf("status %d", rec.Code)
	}
	want := got{"/v1/shops/{shop}/orders/{id}/refund", []string{"s1", "7"}}
	if !reflect.DeepEqual(inGroup, want) {
		t.Errorf("in the group: %+v, want %+v", inGroup, want)
	}
	if onRouter.pattern != "" {
		t.Errorf("on the router, before routing: pattern %q, want none", onRouter.pattern)
	}
}
