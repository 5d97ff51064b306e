package middleware_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/middleware"
)

// syncBuffer is a bytes.Buffer safe for a logger shared by goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestScopeInvalid: a tenant or user that cannot scope a key (empty, or
// over 255 bytes: a long JWT sub) is answered 400 scope_invalid, a problem
// document that says which part and its length, and logged without the
// value; the handler does not run.
func TestScopeInvalid(t *testing.T) {
	t.Parallel()
	const marker = "SUBJECTMARKER"
	long := marker + strings.Repeat("u", 256-len(marker))
	tests := []struct {
		name         string
		tenant, user string
		detail       string // substring of the detail
	}{
		{name: "user over 255 bytes", tenant: "acme", user: long, detail: "user identity is 256 bytes"},
		{name: "tenant over 255 bytes", tenant: long + "t", user: "alice", detail: "tenant is 257 bytes"},
		{name: "empty user", tenant: "acme", user: "", detail: "user identity is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var logs syncBuffer
			v := newEnv(t, func(c *middleware.Config) {
				c.Scope = func(echo.Context) (string, string, error) { return tt.tenant, tt.user, nil }
				c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			}, nil)
			rec := v.do(req{key: "k", body: imageBody})
			want{status: 400, code: "scope_invalid", calls: 0}.check(t, v, rec)
			if !strings.Contains(rec.Body.String(), tt.detail) {
				t.Errorf("detail of %s does not say %q", rec.Body, tt.detail)
			}
			if strings.Contains(rec.Body.String(), marker) {
				t.Errorf("answer echoes the identity: %s", rec.Body)
			}
			out := logs.String()
			if !strings.Contains(out, "scope") {
				t.Errorf("nothing logged: %q", out)
			}
			if strings.Contains(out, marker) || strings.Contains(out, "alice") {
				t.Errorf("log has the raw tenant or user: %s", out)
			}
		})
	}
}
