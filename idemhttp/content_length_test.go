package idemhttp_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/idemhttp"
)

// TestWrongContentLengthIsTheHandlersError: a handler that declares a
// Content-Length and writes past it gets http.ErrContentLength from its
// Write, as it would without the middleware, rather than the silence the
// writer keeps for a client that went away; and a retry replays what
// went out, not the bytes net/http refused.
func TestWrongContentLengthIsTheHandlersError(t *testing.T) {
	writeErr := make(chan error, 2)
	mw := idemhttp.New(idemhttp.Config{Store: newStore(t), Scope: scopeFromHeader})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/notes", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "5")
		w.WriteHeader(http.StatusCreated)
		if _, err := io.WriteString(w, "01234"); err != nil {
			writeErr <- err
			return
		}
		_, err := io.WriteString(w, "56789")
		writeErr <- err
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	post := func() (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/notes", strings.NewReader(`{}`))
		req.Header.Set("X-Caller", "acme/alice")
		req.Header.Set("Idempotency-Key", "k-content-length")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("post: %v", err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("read body: %v", err)
		}
		return resp.StatusCode, string(b)
	}

	status, body := post()
	if err := <-writeErr; !errors.Is(err, http.ErrContentLength) {
		t.Fatalf("the write past Content-Length returned %v, want http.ErrContentLength", err)
	}
	if status != http.StatusCreated || body != "01234" {
		t.Fatalf("first answer = %d %q, want 201 %q", status, body, "01234")
	}
	status, body = post()
	if status != http.StatusCreated || body != "01234" {
		t.Fatalf("replay = %d %q, want what went out: 201 %q", status, body, "01234")
	}
}
