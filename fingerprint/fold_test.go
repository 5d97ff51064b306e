package fingerprint

import (
	"bytes"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
)

const formType = "application/x-www-form-urlencoded"

// TestFoldedNames: with Fields or Exclude, a member or form field whose
// name folds onto a selected or excluded name without being equal to it is
// refused, at every level along a pointer, and the error names the pointer
// and an offset but not the name found.
func TestFoldedNames(t *testing.T) {
	t.Parallel()
	image := Spec{Fields: []string{"/prompt", "/n"}}
	tests := []struct {
		name    string
		spec    Spec
		given   body
		pointer string // named in the error
		off     string // "offset N" in the error
	}{
		{"capitalized selected member", image, body{"application/json", `{"Prompt":"a dog","n":1}`}, `"/prompt"`, "offset 1"},
		{"folded duplicate after the exact one", image, body{"application/json", `{"prompt":"x","Prompt":"a dog"}`}, `"/prompt"`, "offset 14"},
		{"folded duplicate before the exact one", image, body{"application/json", `{"PROMPT":"a dog","prompt":"x"}`}, `"/prompt"`, "offset 1"},
		{"escaped capital", image, body{"application/json", `{"\u0050rompt":"a dog"}`}, `"/prompt"`, "offset 1"},
		{"upper-case N", image, body{"application/json", `{"prompt":"x","N":2}`}, `"/n"`, "offset 14"},
		{"long s folds to s", Spec{Fields: []string{"/size"}}, body{"application/json", `{"ſize":"16:9"}`}, `"/size"`, "offset 1"},
		{"escaped long s", Spec{Fields: []string{"/size"}}, body{"application/json", `{"\u017fize":"16:9"}`}, `"/size"`, "offset 1"},
		{"Kelvin sign folds to k", Spec{Fields: []string{"/k"}}, body{"application/json", `{"k":1,"\u212a":2}`}, `"/k"`, "offset 7"},
		{"fold on the first level of a deeper pointer", Spec{Fields: []string{"/size/w"}}, body{"application/json", `{"Size":{"w":1}}`}, `"/size/w"`, "offset 1"},
		{"fold on the last level", Spec{Fields: []string{"/size/w"}}, body{"application/json", `{"size":{"w":1,"W":2}}`}, `"/size/w"`, "offset 15"},
		{"fold below an array element", Spec{Fields: []string{"/items/0/sku"}}, body{"application/json", `{"items":[{"SKU":1}]}`}, `"/items/0/sku"`, "offset 11"},
		{"fold onto an excluded name", Spec{Exclude: []string{"/note"}}, body{"application/json", `{"Note":"x","a":1}`}, `excluded field "/note"`, "offset 1"},
		{"selected name written in capitals", Spec{Fields: []string{"/Prompt"}}, body{"application/json", `{"prompt":"x"}`}, `"/Prompt"`, "offset 1"},
		{"form field in capitals", image, body{formType, "Prompt=a+dog&n=1"}, `"/prompt"`, "offset 0"},
		{"form field all capitals", image, body{formType, "n=1&PROMPT=a+cat"}, `"/prompt"`, "offset 4"},
		{"form field beside the exact one", image, body{formType, "prompt=x&Prompt=a+dog"}, `"/prompt"`, "offset 9"},
		{"form field escaped", image, body{formType, "n=1&%50rompt=x"}, `"/prompt"`, "offset 4"},
		{"form field onto an excluded name", Spec{Exclude: []string{"/note"}}, body{formType, "a=1&NOTE=x"}, `excluded field "/note"`, "offset 4"},
		{"form field with a long s", Spec{Fields: []string{"/size"}}, body{formType, "%C5%BFize=1"}, `"/size"`, "offset 0"},
		{"first folded form field named", image, body{formType, "n=1&N=2&Prompt=3"}, `"/n"`, "offset 4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest("POST", "/", nil)
			r.Header.Set("Content-Type", tt.given.contentType)
			fp, err := tt.spec.SumRequest(r, []byte(tt.given.data))
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("SumRequest(%s) = %q, %v; want an error wrapping ErrInvalid", tt.given.data, fp, err)
			}
			msg := err.Error()
			if !strings.Contains(msg, tt.pointer) || !strings.Contains(msg, tt.off+" ") {
				t.Errorf("error %q, want it to name %s and %s", msg, tt.pointer, tt.off)
			}
			for _, leak := range []string{"Prompt", "PROMPT", "dog", "cat", "Size", "SKU", "Note", "NOTE", "ſ", "\u212a"} {
				if strings.Contains(msg, leak) && !strings.Contains(tt.pointer, leak) {
					t.Errorf("error %q quotes the body (%q)", msg, leak)
				}
			}
		})
	}
}

// TestFoldedNamesAllowed: folding matters only along a pointer; the whole
// body without a Spec, names that merely share a prefix, folds elsewhere
// in the body and folds inside a selected value are fine, as the whole
// value is hashed there.
func TestFoldedNamesAllowed(t *testing.T) {
	t.Parallel()
	image := Spec{Fields: []string{"/prompt", "/n"}}
	tests := []struct {
		name  string
		spec  Spec
		given body
	}{
		{"whole body", Spec{}, body{"application/json", `{"Prompt":"a","prompt":"b"}`}},
		{"whole form", Spec{}, body{formType, "Prompt=a&prompt=b"}},
		{"longer name", image, body{"application/json", `{"prompt":"a","prompts":"b","n":1}`}},
		{"fold off the pointer's path", image, body{"application/json", `{"prompt":"a","x":{"PROMPT":1,"N":2}}`}},
		{"fold inside a selected value", image, body{"application/json", `{"prompt":{"A":1,"a":2},"n":1}`}},
		{"fold below a selected array", Spec{Fields: []string{"/items"}}, body{"application/json", `{"items":[{"SKU":1,"sku":2}]}`}},
		{"deeper pointer on another branch", Spec{Fields: []string{"/size/w"}}, body{"application/json", `{"size":{"w":1},"other":{"W":2}}`}},
		{"unrelated form field", image, body{formType, "prompt=a&n=1&note=x"}},
		{"form with a two-token pointer", Spec{Fields: []string{"/size/w"}}, body{formType, "SIZE=1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sumRequest(t, tt.spec, tt.given)
		})
	}
}

// TestFoldedNamesNoReplay: the request pairs of the issue never share a
// fingerprint (both are refused).
func TestFoldedNamesNoReplay(t *testing.T) {
	t.Parallel()
	spec := Spec{Fields: []string{"/prompt", "/n"}}
	for _, pair := range [][2]body{
		{{"application/json", `{"Prompt":"a dog","n":1}`}, {"application/json", `{"Prompt":"a cat","n":1}`}},
		{{"application/json", `{"prompt":"x","Prompt":"a dog"}`}, {"application/json", `{"prompt":"x","Prompt":"a cat"}`}},
		{{formType, "Prompt=a+dog&n=1"}, {formType, "PROMPT=a+cat&n=1"}},
	} {
		var fps [2]Fingerprint
		for i, b := range pair {
			r := httptest.NewRequest("POST", "/", nil)
			r.Header.Set("Content-Type", b.contentType)
			fp, err := spec.SumRequest(r, []byte(b.data))
			if err == nil {
				fps[i] = fp
			}
		}
		if fps[0] != "" && fps[0] == fps[1] {
			t.Errorf("%s and %s share the fingerprint %s", pair[0].data, pair[1].data, fps[0])
		}
	}
}

// TestEqualFold checks equalFold against bytes.EqualFold on the folds that
// matter and on invalid UTF-8.
func TestEqualFold(t *testing.T) {
	t.Parallel()
	words := []string{"", "s", "S", "ſ", "k", "K", "\u212a", "prompt", "Prompt", "PROMPT", "ſize", "SIZE", "size", "\xff", "\xfe", "\ufffd",
		"é", "É", "ß", "ẞ", "ss", "σ", "ς", "Σ", "a\xffb", "A\xfeB", "ǅ", "ǆ", "Ǆ", "KELVIN", "\u212aelvin"}
	for _, a := range words {
		for _, b := range words {
			if got, want := equalFold([]byte(a), b), bytes.EqualFold([]byte(a), []byte(b)); got != want {
				t.Errorf("equalFold(%q, %q) = %v, bytes.EqualFold says %v", a, b, got, want)
			}
		}
	}
}

func FuzzEqualFold(f *testing.F) {
	f.Add("prompt", "PROMPT")
	f.Add("ſize", "SIZE")
	f.Add("\u212a", "k")
	f.Add("a\xff", "A\xfe")
	f.Fuzz(func(t *testing.T, a, b string) {
		if got, want := equalFold([]byte(a), b), bytes.EqualFold([]byte(a), []byte(b)); got != want {
			t.Fatalf("equalFold(%q, %q) = %v, bytes.EqualFold says %v", a, b, got, want)
		}
	})
}

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
