package doortest

import "testing"

func TestColonPattern(t *testing.T) {
	t.Parallel()
	tests := []struct{ given, want string }{
		{"/v1/images", "/v1/images"},
		{"/v1/orders/{id}/refund", "/v1/orders/:id/refund"},
		{"/v1/shops/{shop}/orders/{id}", "/v1/shops/:shop/orders/:id"},
		{"/", "/"},
	}
	for _, tt := range tests {
		if got := ColonPattern(tt.given); got != tt.want {
			t.Errorf("ColonPattern(%q) = %q, want %q", tt.given, got, tt.want)
		}
	}
}
