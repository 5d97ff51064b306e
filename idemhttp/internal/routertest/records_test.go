package routertest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/idemhttp"
	"github.com/idemgate/idemgate/internal/doortest"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/redisstore"
)

// TestRecordsAcrossRouters: a service that moves from one router to
// another on the same store keeps the records of its routes without
// wildcards, which every router spells alike: a retry behind the new
// router replays the answer stored behind the old one. A route with a
// wildcard is spelled /v1/orders/:id/refund by echo and
// /v1/orders/{id}/refund by the others, a template of its own: a retry
// that spans a move to or from echo runs as a new request (another kind,
// so another key), one between ServeMux, chi and gorilla/mux replays.
func TestRecordsAcrossRouters(t *testing.T) {
	t.Parallel()
	client := redis.NewClient(testenv.Redis(t))
	t.Cleanup(func() { client.Close() })
	store := redisstore.New(client)
	doors := []struct {
		name string
		new  func(t *testing.T, s doortest.Setup) http.Handler
	}{
		{"echo", echoApp},
		{"ServeMux", serveMux},
		{"chi", chiGroup},
		{"gorilla", gorilla},
	}
	for _, from := range doors {
		for _, to := range doors {
			if from.name == to.name {
				continue
			}
			for _, path := range []string{"/v1/images", "/v1/orders/7/refund"} {
				t.Run(from.name+" to "+to.name+" "+path, func(t *testing.T) {
					t.Parallel()
					var calls atomic.Int64
					handler := func(w http.ResponseWriter, _ *http.Request) {
						w.WriteHeader(http.StatusCreated)
						_, _ = io.WriteString(w, "run "+strconv.FormatInt(calls.Add(1), 10))
					}
					setup := doortest.Setup{
						Routes: []doortest.Route{
							{Method: http.MethodPost, Pattern: "/v1/images", Handler: handler},
							{Method: http.MethodPost, Pattern: "/v1/orders/{id}/refund", Handler: handler},
						},
						Config: doortest.Config{Store: store, Scope: headerScope},
					}
					tenant := newTenant()
					send := func(h http.Handler) *httptest.ResponseRecorder {
						r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{"n":1}`))
						r.Header.Set("Content-Type", "application/json")
						r.Header.Set("Idempotency-Key", "k")
						r.Header.Set("X-Tenant", tenant)
						r.Header.Set("X-User", "alice")
						rec := httptest.NewRecorder()
						h.ServeHTTP(rec, r)
						return rec
					}
					if rec := send(from.new(t, setup)); rec.Code != http.StatusCreated || rec.Body.String() != "run 1" {
						t.Fatalf("behind %s: %d %q, want 201 run 1", from.name, rec.Code, rec.Body)
					}
					rec := send(to.new(t, setup))
					wantReplay := !strings.Contains(path, "orders") || (from.name != "echo" && to.name != "echo")
					if got := rec.Header().Get("Idempotent-Replayed") == "true"; got != wantReplay || rec.Code != http.StatusCreated {
						t.Errorf("retry behind %s = %d %q, replayed %v; want 201, replayed %v", to.name, rec.Code, rec.Body, got, wantReplay)
					}
					if want := map[bool]int64{true: 1, false: 2}[wantReplay]; calls.Load() != want {
						t.Errorf("handler ran %d times, want %d", calls.Load(), want)
					}
				})
			}
		}
	}
}

// echoApp serves s on echo, the middleware on the whole app.
func echoApp(t *testing.T, s doortest.Setup) http.Handler {
	mw, err := middleware.Config{Store: s.Config.Store, Scope: func(c echo.Context) (string, string, error) {
		return s.Config.Scope(c.Request())
	}}.ToMiddleware()
	if err != nil {
		t.Fatalf("ToMiddleware: %v", err)
	}
	e := echo.New()
	e.Use(mw)
	for _, r := range s.Routes {
		e.Add(r.Method, doortest.ColonPattern(r.Pattern), echo.WrapHandler(r.Handler))
	}
	return e
}

// serveMux serves s on Go's ServeMux, the middleware on each route.
func serveMux(t *testing.T, s doortest.Setup) http.Handler {
	mw, err := idemhttp.Config{Store: s.Config.Store, Scope: s.Config.Scope}.ToMiddleware()
	if err != nil {
		t.Fatalf("ToMiddleware: %v", err)
	}
	mux := http.NewServeMux()
	for _, r := range s.Routes {
		mux.Handle(r.Method+" "+r.Pattern, mw(r.Handler))
	}
	return mux
}

// headerScope reads the tenant and user from headers the test sets.
func headerScope(r *http.Request) (string, string, error) {
	tenant, user := r.Header.Get("X-Tenant"), r.Header.Get("X-User")
	if tenant == "" || user == "" {
		return "", "", errors.New("no X-Tenant or X-User")
	}
	return tenant, user, nil
}

func newTenant() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "t" + hex.EncodeToString(b[:])
}
