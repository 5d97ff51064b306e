package idemhttp

import (
	"slices"
	"testing"
)

// TestServeMuxPattern: the template of a ServeMux pattern is its host and
// path without the method, and its wildcards are named in order, "{$}"
// not among them.
func TestServeMuxPattern(t *testing.T) {
	t.Parallel()
	tests := []struct {
		given        string
		wantTemplate string
		wantNames    []string
	}{
		{"", "", nil},
		{"/v1/orders", "/v1/orders", nil},
		{"POST /v1/orders/{id}/refund", "/v1/orders/{id}/refund", []string{"id"}},
		{"PATCH example.com/v1/{a}/{b...}", "example.com/v1/{a}/{b...}", []string{"a", "b"}},
		{"GET /{$}", "/{$}", nil},
	}
	s := &shared{names: make(map[string][]string)}
	for _, tt := range tests {
		if got := patternPath(tt.given); got != tt.wantTemplate {
			t.Errorf("patternPath(%q) = %q, want %q", tt.given, got, tt.wantTemplate)
		}
		for range 2 { // parsed, then cached
			if got := s.wildcards(tt.given); !slices.Equal(got, tt.wantNames) {
				t.Errorf("wildcards(%q) = %q, want %q", tt.given, got, tt.wantNames)
			}
		}
	}
}
