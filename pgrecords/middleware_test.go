package pgrecords_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/middleware"
)

// e2e is an echo app with the middleware on s, whose handler counts its
// runs and answers with the body it was sent.
func e2e(t *testing.T, s idemgate.Store, cfg middleware.Config) (*echo.Echo, *atomic.Int64) {
	t.Helper()
	var runs atomic.Int64
	cfg.Store = s
	cfg.Scope = func(c echo.Context) (string, string, error) { return "acme", c.Request().Header.Get("X-User"), nil }
	e := echo.New()
	e.POST("/v1/images", func(c echo.Context) error {
		n := runs.Add(1)
		body, _ := io.ReadAll(c.Request().Body)
		c.Response().Header().Set("X-Run", fmt.Sprint(n))
		return c.Blob(http.StatusCreated, "application/octet-stream", append([]byte("secret:"), body...))
	}, middleware.New(cfg))
	return e, &runs
}

func send(e *echo.Echo, user, key string, body []byte) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/v1/images", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/octet-stream")
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("X-User", user)
	w := httptest.NewRecorder()
	e.ServeHTTP(w, r)
	return w
}

// TestMiddlewareEndToEnd: the middleware on pgrecords, as the
// example wires it with STORE=postgres: a retry replays byte for byte
// without running the handler; another body, another user or a body that
// differs in one byte under the same key get 409 key_reused with nothing
// of the stored response; concurrent identical requests run the handler
// once.
func TestMiddlewareEndToEnd(t *testing.T) {
	t.Parallel()
	s := newStore(t, newPool(t, testenv.PostgresDSN(t)))
	e, runs := e2e(t, s, middleware.Config{})
	body := append([]byte("prompt\x00\xff"), bytes.Repeat([]byte{7}, 1000)...)
	first := send(e, "alice", "req-1", body)
	if first.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	again := send(e, "alice", "req-1", body)
	if again.Code != http.StatusCreated || !bytes.Equal(again.Body.Bytes(), first.Body.Bytes()) ||
		again.Header().Get("Idempotent-Replayed") != "true" || again.Header().Get("X-Run") != "1" {
		t.Errorf("retry: %d %q %v, want the replay", again.Code, again.Body, again.Header())
	}
	for name, w := range map[string]*httptest.ResponseRecorder{
		"another body":          send(e, "alice", "req-1", append(bytes.Clone(body), 0)),
		"one byte flipped":      send(e, "alice", "req-1", append([]byte{'P'}, body[1:]...)),
		"another user, same id": send(e, "bob", "req-1", body),
	} {
		switch name {
		case "another user, same id":
			// Another user's key is another key: a fresh claim, a run of its own.
			if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
				t.Errorf("%s: %d %v, want a run of its own", name, w.Code, w.Header())
			}
		default:
			if w.Code != http.StatusConflict || bytes.Contains(w.Body.Bytes(), []byte("secret")) || w.Header().Get("X-Run") != "" ||
				!bytes.Contains(w.Body.Bytes(), []byte("key_reused")) {
				t.Errorf("%s: %d %q %v, want 409 key_reused carrying nothing", name, w.Code, w.Body, w.Header())
			}
		}
	}
	before := runs.Load()
	var wg sync.WaitGroup
	codes := make([]int, 24)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i] = send(e, "carol", "req-concurrent", body).Code
		}()
	}
	wg.Wait()
	if n := runs.Load() - before; n != 1 {
		t.Errorf("24 concurrent identical requests ran the handler %d times (codes %v)", n, codes)
	}
}
