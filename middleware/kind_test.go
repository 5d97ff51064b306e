package middleware

import (
	"strings"
	"testing"
)

func TestDeriveKind(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		method, path string
		want         string // exact kind; "" when only the prefix is checked
		prefix       string // wanted prefix of an inexact kind (digest appended)
	}{
		{name: "plain route", method: "POST", path: "/v1/images", want: "post-v1-images"},
		{name: "trailing slash is inexact", method: "POST", path: "/v1/images/", prefix: "post-v1-images-"},
		{name: "double slash is inexact", method: "POST", path: "/v1//images", prefix: "post-v1-images-"},
		{name: "parameter is inexact", method: "POST", path: "/v1/orders/:id/refund", prefix: "post-v1-orders-id-refund-"},
		{name: "root", method: "POST", path: "/", want: "post"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := deriveKind(tt.method, tt.path)
			if tt.want != "" && got != tt.want {
				t.Errorf("deriveKind(%q, %q) = %q, want %q", tt.method, tt.path, got, tt.want)
			}
			if tt.prefix != "" && (!strings.HasPrefix(got, tt.prefix) || len(got) != len(tt.prefix)+8) {
				t.Errorf("deriveKind(%q, %q) = %q, want %q + 8 hex digits", tt.method, tt.path, got, tt.prefix)
			}
		})
	}
	// Routes that echo tells apart never share a kind.
	seen := map[string]string{}
	for _, p := range []string{"/v1/images", "/v1/images/", "/v1//images", "/v1/images//", "/", "/v1/images/_"} {
		k := deriveKind("POST", p)
		if other, ok := seen[k]; ok {
			t.Errorf("%q and %q share the kind %q", p, other, k)
		}
		seen[k] = p
	}
}
