package middleware_test

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
)

// failedWrites wraps the server's ResponseWriter (outside echo) and counts
// the writes to the connection that failed, so that a test can tell that
// its client really was gone when the handler wrote.
type failedWrites struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (w failedWrites) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	if err != nil {
		w.n.Add(1)
	}
	return n, err
}

func (w failedWrites) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// TestClientLeftBeforeWrite: the client times out while the handler runs,
// then the handler writes a response larger than the socket buffer and the
// write to the connection fails (broken pipe). A response the handler
// produced in full is stored all the same, and the retry replays it: the
// handler runs once. A response it could not produce in full (its own
// error, or larger than MaxResponseBytes) is not stored, and the retry runs.
func TestClientLeftBeforeWrite(t *testing.T) {
	t.Parallel()
	blob := func(size int) func(c echo.Context) error {
		return func(c echo.Context) error {
			return c.Blob(http.StatusCreated, "application/octet-stream", bytes.Repeat([]byte{'x'}, size))
		}
	}
	tests := []struct {
		name      string
		size      int // response bytes the handler writes
		maxResp   int64
		h         func(c echo.Context) error
		wantCalls int64 // after the retry
		mustFail  bool  // the write to the gone client must fail
	}{
		{name: "64 KiB blob", size: 64 << 10, wantCalls: 1},
		{name: "512 KiB blob", size: 512 << 10, wantCalls: 1, mustFail: true},
		{name: "512 KiB in 16 KiB writes, stopping at the first error", size: 512 << 10, wantCalls: 1, mustFail: true,
			h: func(c echo.Context) error {
				c.Response().Header().Set("Content-Type", "application/octet-stream")
				c.Response().WriteHeader(http.StatusCreated)
				chunk := bytes.Repeat([]byte{'x'}, 16<<10)
				for range 32 {
					if _, err := c.Response().Write(chunk); err != nil {
						return err
					}
				}
				return nil
			}},
		{name: "512 KiB in flushed 16 KiB writes, stopping at the first error", size: 512 << 10, wantCalls: 1, mustFail: true,
			h: func(c echo.Context) error {
				c.Response().Header().Set("Content-Type", "application/octet-stream")
				c.Response().WriteHeader(http.StatusCreated)
				chunk := bytes.Repeat([]byte{'x'}, 16<<10)
				rc := http.NewResponseController(c.Response())
				for range 32 {
					if _, err := c.Response().Write(chunk); err != nil {
						return err
					}
					if err := rc.Flush(); err != nil {
						return err
					}
				}
				return nil
			}},
		{name: "handler error after writing is released", size: 512 << 10, wantCalls: 2, mustFail: true,
			h: func(c echo.Context) error {
				_ = blob(512 << 10)(c)
				return errors.New("handler failed after writing")
			}},
		{name: "response over MaxResponseBytes is not stored", size: 512 << 10, maxResp: 128 << 10, wantCalls: 2, mustFail: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := tt.h
			if h == nil {
				h = blob(tt.size)
			}
			got := clientLeft(t, tt.maxResp, h)
			if tt.mustFail && got.failed == 0 {
				t.Fatalf("no write to the gone client failed: the test proves nothing")
			}
			t.Logf("failed writes to the gone client: %d", got.failed)
			if got.calls != tt.wantCalls {
				t.Errorf("handler ran %d times, want %d", got.calls, tt.wantCalls)
			}
			if got.replayed != (tt.wantCalls == 1) {
				t.Errorf("retry replayed = %v, want %v (status %d)", got.replayed, tt.wantCalls == 1, got.status)
			}
			if got.status != http.StatusCreated || len(got.body) != tt.size || strings.Trim(string(got.body), "x") != "" {
				t.Errorf("retry = %d with %d bytes, want 201 with the %d bytes the handler wrote", got.status, len(got.body), tt.size)
			}
		})
	}
}
