package fingerprint

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A routeCase is one request target bound to a body fingerprint.
type routeCase struct {
	Name        string      `json:"name"`
	Method      string      `json:"method"`
	Template    string      `json:"template"`
	Names       []string    `json:"names"`
	Values      []string    `json:"values"`
	RawQuery    string      `json:"raw_query"`
	Body        Fingerprint `json:"body"`
	Fingerprint Fingerprint `json:"fingerprint,omitempty"`
}

func (c routeCase) sum() Fingerprint {
	return NewRoute(c.Method, c.Template).Sum(c.Names, c.Values, c.RawQuery, c.Body)
}

const (
	bodyA = Fingerprint("v1:1a2a1cd87c9133db3dcc186981cae933e082ab106a1a3e10b867129a86704885")
	bodyB = Fingerprint("v1:5802da986b1e8c5eece7c90fce540a2e5f4fb97c72d893e0b2db644a25db495d")
)

// TestRouteGolden pins the route fingerprints of v1, as TestGolden pins
// the body fingerprints.
func TestRouteGolden(t *testing.T) {
	t.Parallel()
	path := filepath.Join("testdata", "route_golden.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cases []routeCase
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) == 0 {
		t.Fatal("no golden cases")
	}
	for i, c := range cases {
		got := c.sum()
		if *update {
			cases[i].Fingerprint = got
			continue
		}
		if got != c.Fingerprint {
			t.Errorf("%s: fingerprint %s, golden %s: the v1 route algorithm changed", c.Name, got, c.Fingerprint)
		}
	}
	if *update {
		out, err := json.MarshalIndent(cases, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(out, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRouteLayout rebuilds the hash input of Route.Sum by hand, as its doc
// comment gives it.
func TestRouteLayout(t *testing.T) {
	t.Parallel()
	str := func(s string) string { return string([]byte{byte(len(s))}) + s } // every length here < 128
	n := func(i int) string { return string([]byte{byte(i)}) }
	want := func(parts ...string) Fingerprint {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		h := sha256.Sum256(b)
		return Fingerprint("v1:" + hex.EncodeToString(h[:]))
	}
	const head = "idemgate route v1\x00"
	tests := []struct {
		name string
		got  Fingerprint
		want Fingerprint
	}{
		{"no parameters, no query",
			NewRoute("POST", "/v1/images").Sum(nil, nil, "", bodyA),
			want(head, str("POST"), str("/v1/images"), str(string(bodyA)), n(0), n(0), str(""))},
		{"parameters and query",
			NewRoute("POST", "/v1/orders/:id/refund").Sum([]string{"id"}, []string{"42"}, "dry_run=true", bodyB),
			want(head, str("POST"), str("/v1/orders/:id/refund"), str(string(bodyB)), n(1), str("id"), n(1), str("42"), str("dry_run=true"))},
		{"zero Route",
			Route{}.Sum(nil, nil, "", ""),
			want(head, str(""), str(""), str(""), n(0), n(0), str(""))},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: got %s, want %s", tt.name, tt.got, tt.want)
		}
	}
}

// TestRouteDistinct: every part of the request target takes part, and the
// framing keeps neighbouring parts apart.
func TestRouteDistinct(t *testing.T) {
	t.Parallel()
	base := routeCase{Method: "POST", Template: "/v1/orders/:id/refund", Names: []string{"id"}, Values: []string{"1"}, RawQuery: "a=1&b=2", Body: bodyA}
	tests := []struct {
		name string
		when func(c *routeCase)
	}{
		{"other method", func(c *routeCase) { c.Method = "PATCH" }},
		{"other template", func(c *routeCase) { c.Template = "/v1/orders/:id/cancel" }},
		{"other path parameter value", func(c *routeCase) { c.Values = []string{"2"} }},
		{"other path parameter name", func(c *routeCase) { c.Names = []string{"order"} }},
		{"no path parameter", func(c *routeCase) { c.Names, c.Values = nil, nil }},
		{"empty path parameter value", func(c *routeCase) { c.Values = []string{""} }},
		{"one more path parameter", func(c *routeCase) { c.Names, c.Values = []string{"id", "x"}, []string{"1", ""} }},
		{"a value without its name", func(c *routeCase) { c.Names = nil }},
		{"other query", func(c *routeCase) { c.RawQuery = "a=2&b=2" }},
		{"no query", func(c *routeCase) { c.RawQuery = "" }},
		{"reordered query", func(c *routeCase) { c.RawQuery = "b=2&a=1" }},
		{"re-escaped query", func(c *routeCase) { c.RawQuery = "a=%31&b=2" }},
		{"other body", func(c *routeCase) { c.Body = bodyB }},
		{"method and template shifted", func(c *routeCase) { c.Method, c.Template = "POST/v1", "/orders/:id/refund" }},
		{"template and value shifted", func(c *routeCase) { c.Template, c.Values = "/v1/orders/:id/refund1", []string{""} }},
		{"value and query shifted", func(c *routeCase) { c.Values, c.RawQuery = []string{"1a=1&b=2"}, "" }},
		{"name and value swapped", func(c *routeCase) { c.Names, c.Values = []string{"1"}, []string{"id"} }},
		{"two values joined", func(c *routeCase) {
			c.Names, c.Values = []string{"id", "x"}, []string{"1", "2"}
		}},
	}
	for _, tt := range tests {
		b := base
		b.Names, b.Values = slices.Clone(base.Names), slices.Clone(base.Values)
		tt.when(&b)
		if b.sum() == base.sum() {
			t.Errorf("%s: %+v and %+v share a fingerprint", tt.name, b, base)
		}
	}
	// The same request target always gets the same fingerprint, and a
	// Route is a value: two Routes for one template agree.
	if a, b := base.sum(), base.sum(); a != b {
		t.Errorf("same request target, fingerprints %s and %s", a, b)
	}
	if r1, r2 := NewRoute("POST", "/x"), NewRoute("POST", "/x"); r1 != r2 {
		t.Error("NewRoute is not comparable by value")
	}
}

// decodeRouteInput reads a route hash input back into its parts. That it
// can proves the framing unambiguous: two different inputs could not both
// decode from one hash input.
func decodeRouteInput(b []byte) (c routeCase, ok bool) {
	if string(b[:min(len(b), len(routeVersion))]) != routeVersion {
		return c, false
	}
	b = b[len(routeVersion):]
	str := func() (string, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < n {
			return "", false
		}
		s := string(b[k : k+int(n)])
		b = b[k+int(n):]
		return s, true
	}
	list := func() ([]string, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)) {
			return nil, false
		}
		b = b[k:]
		var l []string
		for range n {
			s, ok := str()
			if !ok {
				return nil, false
			}
			l = append(l, s)
		}
		return l, true
	}
	var body string
	var ok1, ok2, ok3, ok4, ok5, ok6 bool
	c.Method, ok1 = str()
	c.Template, ok2 = str()
	body, ok3 = str()
	c.Body = Fingerprint(body)
	c.Names, ok4 = list()
	c.Values, ok5 = list()
	c.RawQuery, ok6 = str()
	return c, ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && len(b) == 0
}

// FuzzRoute: the hash input of Route.Sum decodes back to exactly the parts
// it was built from, so different request targets never share it.
func FuzzRoute(f *testing.F) {
	f.Add("POST", "/v1/orders/:id", "id", "42", "", "a=1", string(bodyA))
	f.Add("", "", "", "", "", "", "")
	f.Add("GET", "/:a/:b", "a\x00b", "x\x01y", "z", "q=%00", "v1:")
	f.Fuzz(func(t *testing.T, method, template, names, values, value2, query, body string) {
		c := routeCase{Method: method, Template: template, RawQuery: query, Body: Fingerprint(body)}
		if names != "" {
			c.Names = []string{names}
		}
		if values != "" {
			c.Values = []string{values, value2}
		}
		in := NewRoute(method, template).appendInput(nil, c.Names, c.Values, query, c.Body)
		got, ok := decodeRouteInput(in)
		if !ok || got.Method != c.Method || got.Template != c.Template || got.Body != c.Body ||
			!slices.Equal(got.Names, c.Names) || !slices.Equal(got.Values, c.Values) || got.RawQuery != c.RawQuery {
			t.Fatalf("%+v framed as %q decodes to %+v (ok %v)", c, in, got, ok)
		}
		h := sha256.Sum256(in)
		if want := Fingerprint("v1:" + hex.EncodeToString(h[:])); c.sum() != want {
			t.Fatalf("Sum %s, hash of the input %s", c.sum(), want)
		}
	})
}

func BenchmarkRouteSum(b *testing.B) {
	r := NewRoute("POST", "/v1/orders/:id/refund")
	names, values := []string{"id"}, []string{"ord_1234567890"}
	b.ReportAllocs()
	for b.Loop() {
		r.Sum(names, values, "dry_run=true", bodyA)
	}
}
