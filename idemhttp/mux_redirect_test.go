package idemhttp_test

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/idemhttp"
)

// TestWholeMuxRedirectIsNoRoute: around a whole ServeMux, a request the
// mux answers with its trailing-slash redirect (301 or 307 to the path with a
// slash) has no route: it passes through untouched, so that no kind or
// route frame is derived from the request's own path (a client choosing
// paths would grow the engine's per-template state without bound), and the
// client that follows the redirect with its key reaches the route.
func TestWholeMuxRedirectIsNoRoute(t *testing.T) {
	var mu sync.Mutex
	var events []idemgate.Event
	mw := idemhttp.New(idemhttp.Config{Store: newStore(t), Scope: scopeFromHeader,
		OnEvent: func(_ context.Context, ev idemgate.Event) {
			mu.Lock()
			events = append(events, ev)
			mu.Unlock()
		}})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/items/{id}/", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	h := mw(mux)

	w := send(t, h, http.MethodPost, "/v1/items/abc", "k-redirect", `{}`)
	if w.Code != http.StatusMovedPermanently && w.Code != http.StatusTemporaryRedirect {
		t.Fatalf("status = %d, want the mux's redirect", w.Code)
	}
	mu.Lock()
	for _, ev := range events {
		t.Errorf("the redirect was protected: event %s kind %q", ev.Type, ev.Kind)
	}
	mu.Unlock()
	// The client follows the redirect with its key: the route runs.
	if w := send(t, h, http.MethodPost, w.Header().Get("Location"), "k-redirect", `{}`); w.Code != http.StatusCreated {
		t.Fatalf("after the redirect, status = %d %s, want 201", w.Code, w.Body)
	}
}
