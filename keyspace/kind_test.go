package keyspace

import (
	"math/rand/v2"
	"strings"
	"testing"
)

func TestKindFor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		method, route string
		want          string // exact kind; "" when only the prefix is checked
		prefix        string // wanted prefix of an inexact kind (digest appended)
	}{
		{name: "plain route", method: "POST", route: "/v1/images", want: "post-v1-images"},
		{name: "trailing slash is inexact", method: "POST", route: "/v1/images/", prefix: "post-v1-images-"},
		{name: "double slash is inexact", method: "POST", route: "/v1//images", prefix: "post-v1-images-"},
		{name: "parameter is inexact", method: "POST", route: "/v1/orders/:id/refund", prefix: "post-v1-orders-id-refund-"},
		{name: "root", method: "POST", route: "/", want: "post"},
		{name: "empty route is inexact", method: "POST", route: "", prefix: "post-"},
		{name: "route without a leading slash is inexact", method: "POST", route: "v1", prefix: "post-v1-"},
		{name: "empty method is inexact", method: "", route: "/v1/images", prefix: "v1-images-"},
		{name: "lower-case method is inexact", method: "post", route: "/v1/images", prefix: "post-v1-images-"},
		{name: "upper-case route is inexact", method: "POST", route: "/V1/images", prefix: "post-v1-images-"},
		{name: "nothing readable", method: "", route: "", prefix: "route-"},
		{name: "leading underscore", method: "_", route: "/", prefix: "route_-"},
		{name: "long route is cut", method: "POST", route: "/" + strings.Repeat("a", 80), prefix: "post-" + strings.Repeat("a", 50) + "-"},
		{name: "cut at a dash", method: "POST", route: "/" + strings.Repeat("a", 49) + "/" + strings.Repeat("b", 20), prefix: "post-" + strings.Repeat("a", 49) + "-"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := KindFor(tt.method, tt.route)
			if tt.want != "" && got != tt.want {
				t.Errorf("KindFor(%q, %q) = %q, want %q", tt.method, tt.route, got, tt.want)
			}
			if tt.prefix != "" && (!strings.HasPrefix(got, tt.prefix) || len(got) != len(tt.prefix)+8) {
				t.Errorf("KindFor(%q, %q) = %q, want %q + 8 hex digits", tt.method, tt.route, got, tt.prefix)
			}
			if err := validateKind(got); err != nil {
				t.Errorf("KindFor(%q, %q) = %q: %v", tt.method, tt.route, got, err)
			}
		})
	}
	// Routes that echo tells apart never share a kind.
	seen := map[string]string{}
	for _, p := range []string{"/v1/images", "/v1/images/", "/v1//images", "/v1/images//", "/", "/v1/images/_"} {
		k := KindFor("POST", p)
		if other, ok := seen[k]; ok {
			t.Errorf("%q and %q share the kind %q", p, other, k)
		}
		seen[k] = p
	}
}

// TestKindForProperties draws methods and routes from a small alphabet, so
// that readable mappings collide often, and checks that every kind is valid
// for Derive and that different routes never share one.
func TestKindForProperties(t *testing.T) {
	t.Parallel()
	const alphabet = "PoST/_-:.aZ9 "
	r := rand.New(rand.NewPCG(1, 2))
	draw := func(max int) string {
		b := make([]byte, r.IntN(max+1))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		return string(b)
	}
	seen := map[string][2]string{}
	for range 50000 {
		method, route := draw(4), draw(8)
		if r.IntN(8) == 0 {
			route += strings.Repeat("a", 60) // past the length limit
		}
		k := KindFor(method, route)
		if err := validateKind(k); err != nil {
			t.Fatalf("KindFor(%q, %q) = %q: %v", method, route, k, err)
		}
		if _, err := Derive(k, Scope{Tenant: "t", User: "u", Request: "r"}); err != nil {
			t.Fatalf("Derive(KindFor(%q, %q)): %v", method, route, err)
		}
		if other, ok := seen[k]; ok && other != [2]string{method, route} {
			t.Fatalf("KindFor(%q, %q) and KindFor(%q, %q) share %q", method, route, other[0], other[1], k)
		}
		seen[k] = [2]string{method, route}
	}
}

// FuzzKindFor: whatever the method and route, the kind is valid for Derive
// and the same inputs give the same kind.
func FuzzKindFor(f *testing.F) {
	for _, s := range [][2]string{{"POST", "/v1/images"}, {"", ""}, {"_", "/"}, {"PATCH", "/v1/orders/:id"}, {"post", "/\xff"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, method, route string) {
		k := KindFor(method, route)
		if err := validateKind(k); err != nil {
			t.Fatalf("KindFor(%q, %q) = %q: %v", method, route, k, err)
		}
		if k2 := KindFor(method, route); k2 != k {
			t.Fatalf("KindFor(%q, %q) not deterministic: %q then %q", method, route, k, k2)
		}
	})
}
