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
// route's path template and its variables, in the template's order
// (mux.Vars is a map). gorilla runs router.Use middleware after it
// matched a route, so the middleware can go on the whole router.
func gorillaRoute(r *http.Request) (pattern string, names, values []string) {
	route := mux.CurrentRoute(r)
	if route == nil {
		return "", nil, nil
	}
	pattern, err := route.GetPathTemplate()
	if err != nil {
		return "", nil, nil
	}
	names, _ = route.GetVarNames()
	vars := mux.Vars(r)
	values = make([]string, len(names))
	for i, name := range names {
		values[i] = vars[name]
	}
	return pattern, names, values
}

// gorilla serves s on gorilla/mux, the middleware on the router
// (router.Use).
func gorilla(t *testing.T, s doortest.Setup) http.Handler {
	cfg := config(s.Config)
	cfg.Route = gorillaRoute
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
// gives the matched route's template and its variables in the template's
// order, whatever order mux.Vars' map has.
func TestGorillaRouteAfterMatching(t *testing.T) {
	t.Parallel()
	var pattern string
	var names, values []string
	router := mux.NewRouter()
	router.Use(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			pattern, names, values = gorillaRoute(r)
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
		if pattern != "/v1/shops/{shop}/orders/{id}/refund" || !slices.Equal(names, []string{"shop", "id"}) || !slices.Equal(values, []string{"s1", "7"}) {
			t.Fatalf("gorillaRoute = %q %q %q", pattern, names, values)
		}
	}
}
