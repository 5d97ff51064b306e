package fingerprint

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// TestFoldedNamesKeepOrder: encoding/json binds two members whose names
// fold together ("prompt", "Prompt", "ſize" and "size") to one struct
// field, the last one winning, so swapping them changes what a handler
// reads. Sum keeps such an object in its order as received (whole body,
// or inside a selected value); any other object is still sorted, and
// Canonicalize (RFC 8785) sorts every object.
func TestFoldedNamesKeepOrder(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		spec     Spec
		given    string
		when     string
		wantSame bool
	}{
		{"whole body, folded pair swapped", Spec{}, `{"prompt":"a dog","Prompt":"a cat"}`, `{"Prompt":"a cat","prompt":"a dog"}`, false},
		{"whole body, long s pair swapped", Spec{}, `{"ſize":"huge","size":"small"}`, `{"size":"small","ſize":"huge"}`, false},
		{"whole body, Kelvin pair swapped", Spec{}, `{"k":1,"\u212a":2}`, `{"\u212a":2,"k":1}`, false},
		{"whole body, escaped folded pair swapped", Spec{}, `{"\u0050rompt":1,"prompt":2}`, `{"prompt":2,"Prompt":1}`, false},
		{"nested object, folded pair swapped", Spec{}, `{"a":{"w":1,"W":2}}`, `{"a":{"W":2,"w":1}}`, false},
		{"inside a selected value", Spec{Fields: []string{"/size"}}, `{"size":{"w":1,"W":2}}`, `{"size":{"W":2,"w":1}}`, false},
		// The whole object keeps its order, not only the folded pair: a
		// false conflict, which is safe.
		{"folded pair in the same order, others moved", Spec{}, `{"x":0,"prompt":"a","Prompt":"b"}`, `{"prompt":"a","Prompt":"b","x":0}`, false},
		{"no folded pair: order is syntax", Spec{}, `{"Prompt":"a","n":1,"Size":2}`, `{"Size":2,"n":1,"Prompt":"a"}`, true},
		{"folded pair beside a moved nested object", Spec{}, `{"a":{"y":1,"x":2},"B":1,"b":2}`, `{"a":{"x":2,"y":1},"B":1,"b":2}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a, err := tt.spec.Sum([]byte(tt.given))
			if err != nil {
				t.Fatal(err)
			}
			b, err := tt.spec.Sum([]byte(tt.when))
			if err != nil {
				t.Fatal(err)
			}
			if (a == b) != tt.wantSame {
				t.Errorf("%s and %s: same = %v, want %v", tt.given, tt.when, a == b, tt.wantSame)
			}
			ca, err := Canonicalize([]byte(tt.given))
			if err != nil {
				t.Fatal(err)
			}
			cb, _ := Canonicalize([]byte(tt.when))
			if string(ca) != string(cb) {
				t.Errorf("Canonicalize must stay RFC 8785 (sorted): %s and %s", ca, cb)
			}
		})
	}
}

// TestFoldCollisionLarge: an object of many members whose names fold in
// pairs is handled in O(n log n) and still told apart when two swap.
func TestFoldCollisionLarge(t *testing.T) {
	t.Parallel()
	var a, b strings.Builder
	a.WriteByte('{')
	b.WriteByte('{')
	for i := range 5000 {
		if i > 0 {
			a.WriteByte(',')
			b.WriteByte(',')
		}
		n := strings.Repeat("x", i%7) + string(rune('a'+i%26)) + strings.Repeat("y", i/26)
		lo, up := `"`+n+`":1`, `"`+strings.ToUpper(n)+`":2`
		a.WriteString(lo + "," + up)
		if i == 4999 {
			lo, up = up, lo
		}
		b.WriteString(lo + "," + up)
	}
	a.WriteByte('}')
	b.WriteByte('}')
	fa, err := Spec{}.Sum([]byte(a.String()))
	if err != nil {
		t.Fatal(err)
	}
	fb, err := Spec{}.Sum([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if fa == fb {
		t.Error("a swapped folded pair in a large object kept the fingerprint")
	}
}

// TestContentEncodingRaw: a body with a Content-Encoding is hashed as
// received with its coding, whatever its media type: the fingerprint
// cannot tell whether the handler reads it decoded, and parsing encoded
// bytes as a form let two gzip streams that decode to different forms
// share a fingerprint (middleware TestAttackEncodedFormCollision).
func TestContentEncodingRaw(t *testing.T) {
	t.Parallel()
	const form = "application/x-www-form-urlencoded"
	sum := func(ct string, ce []string, body string) Fingerprint {
		t.Helper()
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("Content-Type", ct)
		r.Header["Content-Encoding"] = ce
		fp, err := Spec{Fields: []string{"/prompt"}}.SumRequest(r, []byte(body))
		if err != nil {
			t.Fatalf("%s %v %q: %v", ct, ce, body, err)
		}
		return fp
	}
	tests := []struct {
		name     string
		a, b     func() Fingerprint
		wantSame bool
	}{
		{"form escapes are no longer syntax", func() Fingerprint { return sum(form, []string{"gzip"}, "prompt=a%3Db") },
			func() Fingerprint { return sum(form, []string{"gzip"}, "prompt=a=b") }, false},
		{"fields outside the selection take part", func() Fingerprint { return sum("application/json", []string{"gzip"}, `{"prompt":"a","note":1}`) },
			func() Fingerprint { return sum("application/json", []string{"gzip"}, `{"prompt":"a","note":2}`) }, false},
		{"the coding takes part", func() Fingerprint { return sum(form, []string{"gzip"}, "x") },
			func() Fingerprint { return sum(form, []string{"deflate"}, "x") }, false},
		{"the coding as sent", func() Fingerprint { return sum(form, []string{"gzip"}, "x") },
			func() Fingerprint { return sum(form, []string{"GZIP"}, "x") }, false},
		{"with and without a coding", func() Fingerprint { return sum("text/plain", []string{"gzip"}, "x") },
			func() Fingerprint { return sum("text/plain", nil, "x") }, false},
		{"media type parameters take part", func() Fingerprint { return sum(form+"; charset=utf-8", []string{"gzip"}, "x") },
			func() Fingerprint { return sum(form, []string{"gzip"}, "x") }, false},
		{"lines are framed", func() Fingerprint { return sum(form, []string{"gzip", "br"}, "x") },
			func() Fingerprint { return sum(form, []string{"gzip, br"}, "x") }, false},
		{"the same bytes", func() Fingerprint { return sum(form, []string{"gzip"}, "\x1f\x8b;%") },
			func() Fingerprint { return sum(form, []string{"gzip"}, "\x1f\x8b;%") }, true},
		{"an empty body is the empty request", func() Fingerprint { return sum(form, []string{"gzip"}, "") },
			func() Fingerprint { return sum(form, nil, "") }, true},
	}
	for _, tt := range tests {
		if same := tt.a() == tt.b(); same != tt.wantSame {
			t.Errorf("%s: same = %v, want %v", tt.name, same, tt.wantSame)
		}
	}
}

// TestFoldedObjectDuplicates: an object kept in its order because two
// names fold together still refuses a name repeated exactly, wherever the
// repeat is.
func TestFoldedObjectDuplicates(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		`{"a":1,"A":2,"a":3}`,
		`{"A":1,"a":2,"A":3}`,
		`{"x":{"k":1,"\u212a":2,"b":0,"c":0,"d":0,"e":0,"f":0,"g":0,"h":0,"k":3}}`,
		`{"p":1,"P":2,"b":0,"c":0,"d":0,"e":0,"f":0,"g":0,"h":0,"i":0,"\u0070":3}`,
	} {
		if _, err := (Spec{}).Sum([]byte(body)); err == nil || !strings.Contains(err.Error(), "duplicate member name") {
			t.Errorf("%s: err = %v, want a duplicate member name", body, err)
		}
	}
}
