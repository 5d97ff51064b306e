package fingerprint

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func addSeeds(f *testing.F) {
	inputs, _ := filepath.Glob(filepath.Join("testdata", "jcs", "input", "*.json"))
	for _, in := range inputs {
		if b, err := os.ReadFile(in); err == nil {
			f.Add(b)
		}
	}
	for _, s := range []string{
		`{"prompt":"cat","n":1,"size":{"w":1,"h":2},"tags":["a","b"]}`,
		`[1,1.0,1e0,-0,1e-400,9007199254740993,0.10000000000000001]`,
		`[1e-99999999999999999999,0.0012e-0000000000000000099999,-10e-10000000000000000000]`,
		`{"Prompt":1,"prompt":2,"\u017fize":3,"\u212a":4}`,
		`{"\ue000":1,"\ud83d\ude00":2,"a":{"b":[{},[]]}}`,
		`"\u0000\u001f\"\\\/"`,
		`{"a":1,"a":2}`,
		`{"c":0,"b":[1,{"x":null}],"a":true}`,
	} {
		f.Add([]byte(s))
	}
}

// FuzzCanonicalize checks that Canonicalize never panics, accepts exactly
// what Sum accepts (but the empty body, a request of its own for Sum), and that what it returns is valid JSON, its own
// canonical form, and the same value as the input to encoding/json.
func FuzzCanonicalize(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		out, err := Canonicalize(data)
		_, sumErr := Spec{}.Sum(data)
		if len(data) > 0 && (err == nil) != (sumErr == nil) { // Sum accepts the empty body
			t.Fatalf("Canonicalize error %v but Sum error %v", err, sumErr)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("output is not valid JSON: %q", out)
		}
		again, err := Canonicalize(out)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("not idempotent: %q then %q, %v", out, again, err)
		}
		var in, res any
		if err := json.Unmarshal(data, &in); err != nil {
			t.Fatalf("encoding/json rejects accepted input: %v", err)
		}
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("encoding/json rejects output: %v", err)
		}
		if !reflect.DeepEqual(in, res) {
			t.Fatalf("values differ:\n in: %#v\nout: %#v", in, res)
		}
	})
}

// FuzzPointer checks that a JSON Pointer either is rejected with ErrInvalid
// or splits into tokens that escape back to the same pointer, and that no
// pointer makes Sum panic.
func FuzzPointer(f *testing.F) {
	for _, s := range []string{"", "/", "/a", "/a~1b/~0/0", "/~01", "a", "/~", "/~2", "/00/-/10"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, ptr string) {
		toks, err := appendTokens(nil, ptr)
		verr := Spec{Fields: []string{ptr}}.Validate()
		if (err == nil) != (verr == nil) {
			t.Fatalf("appendTokens error %v, Validate error %v", err, verr)
		}
		if err != nil {
			if !errors.Is(verr, ErrInvalid) {
				t.Fatalf("Validate error %v does not wrap ErrInvalid", verr)
			}
			return
		}
		var b strings.Builder
		for _, tok := range toks {
			b.WriteByte('/')
			b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(tok.name))
		}
		if b.String() != ptr {
			t.Fatalf("tokens %+v escape to %q, not %q", toks, b.String(), ptr)
		}
		doc := []byte(`{"a":[0,{"b":1}],"":{"":2},"~/":3}`)
		// A valid pointer is refused only for a member name that folds
		// onto one of its tokens ("/A" and the member "a").
		if _, err := (Spec{Fields: []string{ptr, "/a"}, Exclude: []string{ptr + "/0"}}).Sum(doc); err != nil && !strings.Contains(err.Error(), "only in case") {
			t.Fatalf("Sum with a valid pointer: %v", err)
		}
	})
}

// FuzzSum checks that member order, whitespace, string escapes and number
// spelling never change a fingerprint, with and without a selection.
func FuzzSum(f *testing.F) {
	addSeeds(f)
	specs := []Spec{{}, {Fields: []string{"/a", "/b/0", "/c"}, Exclude: []string{"/b/1", "/a/x"}}}
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, err := (Spec{}).Sum(data); err != nil || len(data) == 0 {
			return
		}
		variant := respell(t, data)
		for _, spec := range specs {
			// A member folding onto a selected name is refused in both.
			want, werr := spec.Sum(data)
			got, err := spec.Sum(variant)
			if (err == nil) != (werr == nil) {
				t.Fatalf("%+v: Sum of %q: %v, of its respelling %q: %v", spec, data, werr, variant, err)
			}
			if err != nil {
				continue
			}
			if got != want {
				t.Fatalf("%+v: %q and its respelling %q differ", spec, data, variant)
			}
		}
	})
}

// respell writes a strict JSON text again with the members of every object
// in reverse order (unless two of its names fold together), whitespace between tokens, strings escaped the way
// encoding/json escapes them, and "e0" after numbers without an exponent.
func respell(t *testing.T, data []byte) []byte {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var write func(b []byte) []byte
	write = func(b []byte) []byte {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("respell: %v", err)
		}
		switch v := tok.(type) {
		case json.Delim:
			if v == '[' {
				b = append(b, "[ "...)
				for i := 0; dec.More(); i++ {
					if i > 0 {
						b = append(b, " ,\n"...)
					}
					b = write(b)
				}
				dec.Token()
				return append(b, " ]"...)
			}
			var members [][]byte
			var names []string
			for dec.More() {
				name, _ := dec.Token()
				names = append(names, name.(string))
				m, _ := json.Marshal(name)
				m = append(m, " : "...)
				members = append(members, write(m))
			}
			dec.Token()
			// Two names that fold together ("a" and "A") bind one struct
			// field, the last one winning: their order is a parameter,
			// so such an object keeps its order.
			reverse := true
			for i := range names {
				for j := i + 1; j < len(names); j++ {
					if strings.EqualFold(names[i], names[j]) {
						reverse = false
					}
				}
			}
			b = append(b, "{\t"...)
			for k := range members {
				i := k
				if reverse {
					i = len(members) - 1 - k
				}
				b = append(b, members[i]...)
				if k < len(members)-1 {
					b = append(b, ",\r\n"...)
				}
			}
			return append(b, " }"...)
		case json.Number:
			b = append(b, v...)
			if !strings.ContainsAny(string(v), "eE") {
				b = append(b, "e0"...)
			}
			return b
		default:
			m, err := json.Marshal(v)
			if err != nil {
				t.Fatalf("respell: %v", err)
			}
			return append(b, m...)
		}
	}
	return write(nil)
}
