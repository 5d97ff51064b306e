package middleware_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/middleware"
)

// Tests of the capture of a response whose client left: the ways a
// handler can write (through echo, past it, streaming, serving a file),
// sizes at the limit, and a hijack that fails.

// leftResult is what a retry saw after the first client left mid-handler.
type leftResult struct {
	calls    int64 // handler runs, the retry included
	replayed bool
	status   int
	body     []byte
	failed   int64 // writes to the gone client that failed
}

// clientLeft runs h under the middleware on a real server: the first
// client gives up while h waits for it to leave, then h writes; a retry
// with the same key follows.
func clientLeft(t *testing.T, maxResp int64, h echo.HandlerFunc) leftResult {
	t.Helper()
	v := newEnv(t, nil, nil)
	entered := make(chan struct{}, 1)
	var calls atomic.Int64
	v.e.POST("/v1/left", func(c echo.Context) error {
		if calls.Add(1) == 1 {
			entered <- struct{}{}
			<-c.Request().Context().Done()
		}
		return h(c)
	}, middleware.New(middleware.Config{Store: v.store, Scope: testScope, MaxResponseBytes: maxResp}))
	var failed atomic.Int64
	var served sync.WaitGroup
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer served.Done()
		v.e.ServeHTTP(failedWrites{w, &failed}, r)
	}))
	t.Cleanup(srv.Close)
	send := func(ctx context.Context) (*http.Response, error) {
		r := req{path: "/v1/left", key: "k", body: imageBody}.build()
		r.RequestURI = ""
		r.URL.Scheme, r.URL.Host = "http", srv.Listener.Addr().String()
		return srv.Client().Do(r.WithContext(ctx))
	}
	ctx, cancel := context.WithCancel(context.Background())
	served.Add(1)
	errc := make(chan error, 1)
	go func() {
		resp, err := send(ctx)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not start")
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("first request: err = %v, want the client to give up", err)
	}
	served.Wait()
	served.Add(1)
	resp, err := send(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	served.Wait()
	return leftResult{calls.Load(), resp.Header.Get("Idempotent-Replayed") == "true", resp.StatusCode, body, failed.Load()}
}

// TestClientLeftWriters: every way a handler writes a response in
// full is stored when its client left, and the retry replays it.
func TestClientLeftWriters(t *testing.T) {
	t.Parallel()
	const size = 512 << 10
	payload := bytes.Repeat([]byte{'x'}, size)
	file := filepath.Join(t.TempDir(), "blob.bin")
	if err := os.WriteFile(file, payload, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		maxResp    int64
		h          echo.HandlerFunc
		wantStatus int
		wantCalls  int64
	}{
		{name: "c.Stream from a reader", wantStatus: 201, wantCalls: 1, h: func(c echo.Context) error {
			return c.Stream(http.StatusCreated, "application/octet-stream", bytes.NewReader(payload))
		}},
		{name: "c.File (http.ServeContent)", wantStatus: 200, wantCalls: 1, h: func(c echo.Context) error {
			return c.File(file)
		}},
		{name: "past echo: c.Response().Writer, checking each error", wantStatus: 201, wantCalls: 1, h: func(c echo.Context) error {
			w := c.Response().Writer
			w.Header().Set("Content-Type", "application/octet-stream")
			w.WriteHeader(http.StatusCreated)
			for off := 0; off < size; off += 4096 {
				if _, err := w.Write(payload[off : off+4096]); err != nil {
					return err
				}
			}
			return nil
		}},
		{name: "io.Copy into c.Response() and Flush", wantStatus: 201, wantCalls: 1, h: func(c echo.Context) error {
			c.Response().WriteHeader(http.StatusCreated)
			if _, err := io.Copy(c.Response(), strings.NewReader(string(payload))); err != nil {
				return err
			}
			c.Response().Flush()
			return nil
		}},
		{name: "exactly MaxResponseBytes", maxResp: size, wantStatus: 201, wantCalls: 1, h: func(c echo.Context) error {
			return c.Blob(http.StatusCreated, "application/octet-stream", payload)
		}},
		{name: "one byte over MaxResponseBytes is not stored", maxResp: size - 1, wantStatus: 201, wantCalls: 2, h: func(c echo.Context) error {
			return c.Blob(http.StatusCreated, "application/octet-stream", payload)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := clientLeft(t, tt.maxResp, tt.h)
			if got.failed == 0 {
				t.Fatal("no write to the gone client failed: the test proves nothing")
			}
			if got.calls != tt.wantCalls || got.replayed != (tt.wantCalls == 1) {
				t.Errorf("handler ran %d times, retry replayed = %v; want %d runs", got.calls, got.replayed, tt.wantCalls)
			}
			if got.status != tt.wantStatus || !bytes.Equal(got.body, payload) {
				t.Errorf("retry = %d with %d bytes, want %d with the %d bytes written", got.status, len(got.body), tt.wantStatus, size)
			}
		})
	}
}

// TestHijackFails: a handler that tries to take the connection over
// (a WebSocket upgrade) where it cannot (HTTP/2, a recorder) and then
// answers normally produced its response in full: it is stored, and the
// retry replays it instead of running the handler again.
func TestHijackFails(t *testing.T) {
	t.Parallel()
	v := newEnv(t, nil, func(c echo.Context, n int64) error {
		if _, _, err := c.Response().Hijack(); err == nil {
			t.Error("Hijack succeeded on a recorder")
		}
		return c.JSON(http.StatusCreated, map[string]int64{"run": n})
	})
	first := v.do(req{key: "k", body: imageBody})
	second := v.do(req{key: "k", body: imageBody})
	if first.Code != http.StatusCreated || second.Code != http.StatusCreated {
		t.Fatalf("answers %d, %d; want 201 twice", first.Code, second.Code)
	}
	if n := v.calls.Load(); n != 1 || second.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("handler ran %d times (replayed %q), want once and a replay", n, second.Header().Get("Idempotent-Replayed"))
	}
}
