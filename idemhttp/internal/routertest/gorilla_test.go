package routertest

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/gorilla/mux"

	"github.com/idemgate/idemgate/internal/doortest"
)

// gorillaRoute is idemhttp's Config.Route on gorilla/mux: the matched
// route's path template. gorilla runs router.Use middleware after it
// matched a route, so the middleware can go on the whole router.
func gorillaRoute(r *http.Request) string {
	if route := mux.CurrentRoute(r); route != nil {
		if template, err := route.GetPathTemplate(); err == nil {
			return template
		}
	}
	return ""
}

// gorillaPathValue is idemhttp's Config.PathValue on gorilla/mux, which
// keeps the values in mux.Vars rather than r.PathValue.
func gorillaPathValue(r *http.Request, name string) string { return mux.Vars(r)[name] }

// gorilla serves s on gorilla/mux, the middleware on the router
// (router.Use).
func gorilla(t *testing.T, s doortest.Setup) http.Handler {
	cfg := config(s.Config)
	cfg.Route = gorillaRoute
	cfg.PathValue = gorillaPathValue
	mw, err := cfg.ToMiddleware()
	if err != nil {
		t.Fatalf("ToMiddleware: %v", err)
	}
	router := mux.NewRouter()
	router.Use(mw)
	for _, rt := range s.Routes {
		router.Handle(rt.Pattern, rt.Handler).Methods(rt.Method)
	}
	return router
}

// TestGorilla runs the behaviour suite on gorilla/mux.
func TestGorilla(t *testing.T) {
	t.Parallel()
	doortest.Run(t, doortest.Door{New: gorilla})
}

// TestGorillaRouteAfterMatching: on the router's middleware gorillaRoute
// gives the matched route's template and gorillaPathValue its variables.
func TestGorillaRouteAfterMatching(t *testing.T) {
	t.Parallel()
	var pattern string
	var values []string
	router := mux.NewRouter()
	router.Use(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			pattern = gorillaRoute(r)
			values = []string{gorillaPathValue(r, "shop"), gorillaPathValue(r, "id")}
			next.ServeHTTP(w, r)
		})
	})
	router.HandleFunc("/v1/shops/{shop}/orders/{id}/refund", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}).Methods(http.MethodPost)
	for range 20 { // map order varies from run to run
		rec := httptest.NewRecorder()
		router.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/shops/s1/orders/7/refund", nil))
		if rec.Code != http.StatusNoContent {
			t.Fatalf("status %d", rec.Code)
		}
		if pattern != "/v1/shops/{shop}/orders/{id}/refund" || !slices.Equal(values, []string{"s1", "7"}) {
			t.Fatalf("gorillaRoute = %q, values %q", pattern, values)
		}
	}
}
