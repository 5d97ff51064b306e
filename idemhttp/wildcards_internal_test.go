package idemhttp

import (
	"slices"
	"testing"
)

// parseWildcards finds the names of ServeMux's, chi's and gorilla/mux's
// wildcards in a route template, in order, with regexps (and their own
// braces) left out.
func TestParseWildcards(t *testing.T) {
	t.Parallel()
	tests := []struct {
		given string
		want  []string
	}{
		{"/v1/images", nil},
		{"/v1/orders/{id}/refund", []string{"id"}},
		{"/v1/shops/{shop}/orders/{id}", []string{"shop", "id"}},
		{"/files/{path...}", []string{"path"}},
		{"/v1/{$}", nil},
		{"/v1/orders/{id:[0-9]+}", []string{"id"}},
		{"/v1/codes/{code:[a-z]{3}}/x/{n}", []string{"code", "n"}},
		{"/v1/{ unclosed", nil},
		{"/v1/{}", nil},
	}
	for _, tt := range tests {
		if got := parseWildcards(tt.given); !slices.Equal(got, tt.want) {
			t.Errorf("parseWildcards(%q) = %q, want %q", tt.given, got, tt.want)
		}
	}
}
