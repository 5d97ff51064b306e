package fingerprint

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// A reference model for TestSumAgainstReference. The test generates random
// bodies (tricky numbers, names and strings, random escapes and whitespace)
// and random Specs, and checks two things against an independent model built on encoding/json:
//
//   - the exact form Sum hashes decodes to the very value of the body
//     (numbers compared as exact rationals), so different values can never
//     share it;
//   - the fingerprint equals the v1 hash input assembled from the model's
//     own Exclude and Fields resolution.
//
// The first property is what rules out a false replay through the JSON
// path: the hash input is a function of the value, and the value a
// function of the hash input.

type zObj struct {
	keys []string
	vals []any
}

var zKeys = []string{"abcdefgh", "abcdefgh1", "abcdefgh\ue000", "abcdefgh😀", "abcdefg\u00e9", "\ue000\ue000\ue000", "\ue000\ue000😀", "a", "b", "0", "1", "00", "a/b", "m~n", "", "é", "\ue000", "😀", "~", "/", "x", "ab", "a\x00", "\u007f", "𝄞", "\uffff"}
var zNums = []string{"0", "-0", "1", "1.0", "10e-1", "100e-2", "0.1", "0.10000000000000001", "9007199254740993", "9007199254740992",
	"1e5", "1E+5", "100000", "-1", "-1.5e-7", "0.0000001", "123.456e3", "1e308", "2e-400", "1e-0000000000000000000001", "0e999", "12345678901234567890123"}
var zStrs = []string{"", "a", "é", "\u00e9", "a b", "a  b", "\"", "\\", "/", "\n", "\x01", "\x7f", "😀", "\ue000", "\ufffd", "1", "null", "true", strings.Repeat("x", 9000), strings.Repeat("é\\", 5000)}

func zGen(r *rand.Rand, depth int) any {
	k := r.IntN(10)
	if depth > 4 {
		k = r.IntN(6)
	}
	switch k {
	case 0:
		return nil
	case 1:
		return r.IntN(2) == 0
	case 2, 3:
		return json.Number(zNums[r.IntN(len(zNums))])
	case 4, 5:
		return zStrs[r.IntN(len(zStrs))]
	case 6, 7:
		n := r.IntN(4)
		a := make([]any, n)
		for i := range a {
			a[i] = zGen(r, depth+1)
		}
		return a
	default:
		o := &zObj{}
		nk := r.IntN(5)
		if r.IntN(8) == 0 {
			nk = r.IntN(len(zKeys) + 1)
		}
		for _, i := range r.Perm(len(zKeys))[:nk] {
			o.keys = append(o.keys, zKeys[i])
			o.vals = append(o.vals, zGen(r, depth+1))
		}
		return o
	}
}

// zWrite writes v as JSON with random escapes and whitespace.
func zWrite(r *rand.Rand, b []byte, v any) []byte {
	ws := func() {
		if r.IntN(4) == 0 {
			b = append(b, " \t\n\r"[r.IntN(4)])
		}
	}
	ws()
	switch v := v.(type) {
	case nil:
		b = append(b, "null"...)
	case bool:
		b = fmt.Append(b, v)
	case json.Number:
		b = append(b, v...)
	case string:
		b = zStr(r, b, v)
	case []any:
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = zWrite(r, b, e)
		}
		b = append(b, ']')
	case *zObj:
		b = append(b, '{')
		for i := range v.keys {
			if i > 0 {
				b = append(b, ',')
			}
			ws()
			b = zStr(r, b, v.keys[i])
			ws()
			b = append(b, ':')
			b = zWrite(r, b, v.vals[i])
		}
		b = append(b, '}')
	}
	ws()
	return b
}

func zStr(r *rand.Rand, b []byte, s string) []byte {
	b = append(b, '"')
	for _, c := range s {
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', byte(c))
		case c < 0x20:
			b = fmt.Appendf(b, "\\u%04x", c)
		case r.IntN(3) == 0:
			if c >= 0x10000 {
				c -= 0x10000
				b = fmt.Appendf(b, "\\u%04X\\u%04x", 0xD800+(c>>10), 0xDC00+(c&0x3ff))
			} else if c == '/' && r.IntN(2) == 0 {
				b = append(b, '\\', '/')
			} else {
				b = fmt.Appendf(b, "\\u%04x", c)
			}
		default:
			b = append(b, string(c)...)
		}
	}
	return append(b, '"')
}

// zDecode decodes strict JSON into the zObj model, numbers as json.Number.
func zDecode(t *testing.T, data []byte) any {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var rd func() any
	rd = func() any {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("decode %q: %v", data, err)
		}
		switch v := tok.(type) {
		case json.Delim:
			if v == '[' {
				a := []any{}
				for dec.More() {
					a = append(a, rd())
				}
				dec.Token()
				return a
			}
			o := &zObj{}
			for dec.More() {
				k, _ := dec.Token()
				o.keys = append(o.keys, k.(string))
				o.vals = append(o.vals, rd())
			}
			dec.Token()
			return o
		}
		return tok
	}
	return rd()
}

func zRat(n json.Number) *big.Rat {
	r, ok := new(big.Rat).SetString(string(n))
	if !ok {
		panic(n)
	}
	return r
}

// zEqual compares values exactly, objects as sets of members.
func zEqual(a, b any) bool {
	switch a := a.(type) {
	case json.Number:
		b, ok := b.(json.Number)
		return ok && zRat(a).Cmp(zRat(b)) == 0
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !zEqual(a[i], b[i]) {
				return false
			}
		}
		return true
	case *zObj:
		b, ok := b.(*zObj)
		if !ok || len(a.keys) != len(b.keys) {
			return false
		}
		for i, k := range a.keys {
			j := slices.Index(b.keys, k)
			if j < 0 || !zEqual(a.vals[i], b.vals[j]) {
				return false
			}
		}
		return true
	default:
		return a == b
	}
}

func zTokens(ptr string) []string {
	if ptr == "" {
		return nil
	}
	parts := strings.Split(ptr[1:], "/")
	for i, p := range parts {
		parts[i] = strings.NewReplacer("~1", "/", "~0", "~").Replace(p)
	}
	return parts
}

func zIndex(tok string) int {
	if tok == "" || len(tok) > 1 && tok[0] == '0' {
		return -1
	}
	n := 0
	for _, c := range tok {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
		if n > 1<<40 {
			return -1
		}
	}
	return n
}

// zExclude removes the values at ptrs (array indexes as received).
func zExclude(v any, ptrs [][]string) any {
	var live [][]string
	for _, p := range ptrs {
		if len(p) > 0 {
			live = append(live, p)
		}
	}
	switch v := v.(type) {
	case []any:
		out := []any{}
		for i, e := range v {
			var deeper [][]string
			drop := false
			for _, p := range live {
				if zIndex(p[0]) == i {
					if len(p) == 1 {
						drop = true
					} else {
						deeper = append(deeper, p[1:])
					}
				}
			}
			if !drop {
				out = append(out, zExclude(e, deeper))
			}
		}
		return out
	case *zObj:
		out := &zObj{}
		for i, k := range v.keys {
			var deeper [][]string
			drop := false
			for _, p := range live {
				if p[0] == k {
					if len(p) == 1 {
						drop = true
					} else {
						deeper = append(deeper, p[1:])
					}
				}
			}
			if !drop {
				out.keys = append(out.keys, k)
				out.vals = append(out.vals, zExclude(v.vals[i], deeper))
			}
		}
		return out
	}
	return v
}

// zSelect finds ptr in the doc as received, honoring exclusions on the way.
// It also returns the typed path of the layout: per token 'o' when it named
// an object member, 'a' when it named an array element.
func zSelect(v any, toks []string, excl [][]string) (any, string, bool) {
	for _, e := range excl {
		if len(e) == 0 {
			return nil, "", false
		}
	}
	if len(toks) == 0 {
		return zExclude(v, excl), "", true
	}
	var next any
	var kind string
	found := false
	switch v := v.(type) {
	case []any:
		if i := zIndex(toks[0]); i >= 0 && i < len(v) {
			next, kind, found = v[i], "a", true
		}
	case *zObj:
		if i := slices.Index(v.keys, toks[0]); i >= 0 {
			next, kind, found = v.vals[i], "o", true
		}
	}
	if !found {
		return nil, "", false
	}
	var deeper [][]string
	for _, e := range excl {
		if e[0] == toks[0] {
			deeper = append(deeper, e[1:])
		}
	}
	sv, path, ok := zSelect(next, toks[1:], deeper)
	return sv, kind + path, ok
}

func zMarshal(v any) []byte {
	switch v := v.(type) {
	case []any:
		var b []byte
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, zMarshal(e)...)
		}
		return append(b, ']')
	case *zObj:
		var b []byte
		b = append(b, '{')
		for i := range v.keys {
			if i > 0 {
				b = append(b, ',')
			}
			k, _ := json.Marshal(v.keys[i])
			b = append(b, k...)
			b = append(b, ':')
			b = append(b, zMarshal(v.vals[i])...)
		}
		return append(b, '}')
	}
	b, _ := json.Marshal(v)
	return b
}

// TestSumAgainstReference checks Sum against the reference model above.
func TestSumAgainstReference(t *testing.T) {
	t.Parallel()
	n := 20000
	if testing.Short() || raceEnabled {
		n = 2000
	}
	r := rand.New(rand.NewPCG(1, 2))
	ptrPool := []string{"", "/a", "/b", "/0", "/1", "/00", "/a~1b", "/m~0n", "/", "/a/b", "/a/0", "/b/1", "/0/0", "/0/a", "/é", "/~0", "/~1", "/a/a", "/1/0", "/b/a/0"}
	for range n {
		v := zGen(r, 0)
		doc := zWrite(r, nil, v)
		// 1. exact canonical form decodes to the same value: injectivity.
		ex := exactForm(t, string(doc))
		back := zDecode(t, []byte(ex))
		if !zEqual(v, back) {
			t.Fatalf("exact form of %s is %s, another value", doc, ex)
		}
		c, err := Canonicalize(doc)
		if err != nil {
			t.Fatalf("%s: %v", doc, err)
		}
		if c2, _ := Canonicalize([]byte(ex)); !bytes.Equal(c, c2) {
			t.Fatalf("Canonicalize(%s)=%s but of exact %s = %s", doc, c, ex, c2)
		}
		// 2. selection against the reference.
		var spec Spec
		for range r.IntN(4) {
			spec.Fields = append(spec.Fields, ptrPool[r.IntN(len(ptrPool))])
		}
		for range r.IntN(3) {
			p := ptrPool[1+r.IntN(len(ptrPool)-1)]
			spec.Exclude = append(spec.Exclude, p)
		}
		got, err := spec.Sum(doc)
		if err != nil {
			t.Fatalf("%s %+v: %v", doc, spec, err)
		}
		var excl [][]string
		for _, e := range spec.Exclude {
			excl = append(excl, zTokens(e))
		}
		in := []byte("idemgate fingerprint v1\x00")
		in = appendStr(in, "application/json")
		if len(spec.Fields) == 0 {
			in = append(in, 'J')
			in = append(in, exactForm(t, string(zMarshal(zExclude(v, excl))))...)
		} else {
			fs := slices.Compact(slices.Sorted(slices.Values(spec.Fields)))
			in = append(in, 'S')
			in = binary.AppendUvarint(in, uint64(len(fs)))
			for _, f := range fs {
				in = appendStr(in, f)
				sv, path, ok := zSelect(v, zTokens(f), excl)
				if !ok {
					in = append(in, 0)
					continue
				}
				in = append(in, 1)
				in = appendStr(in, path)
				in = appendStr(in, exactForm(t, string(zMarshal(sv))))
			}
		}
		h := sha256.Sum256(in)
		if want := Fingerprint("v1:" + hex.EncodeToString(h[:])); got != want {
			t.Fatalf("%s %+v: got %s want %s (input %q)", doc, spec, got, want, in)
		}
	}
}
