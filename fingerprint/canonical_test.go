package fingerprint

import (
	"cmp"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"
)

func TestCanonicalize(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		given string
		want  string
	}{
		{"whitespace goes", " {\n\t\"a\" : [ 1 , 2 ] ,\r\n\"b\":null } ", `{"a":[1,2],"b":null}`},
		{"members sorted", `{"b":1,"a":2,"c":{"z":0,"y":[{"k":1,"j":2}]}}`, `{"a":2,"b":1,"c":{"y":[{"j":2,"k":1}],"z":0}}`},
		{"sorted by code units, not by bytes", `{"\ue000":1,"\ud83d\ude00":2,"\u00e9":3,"z":4}`, "{\"z\":4,\"é\":3,\"😀\":2,\"\ue000\":1}"},
		{"prefix sorts first", `{"ab":1,"a":2,"a\u0000":3}`, `{"a":2,"a\u0000":3,"ab":1}`},
		{"long names sorted past their prefix", `{"abcdefghij":1,"abcdefghi":2,"abcdefghia":3}`, `{"abcdefghi":2,"abcdefghia":3,"abcdefghij":1}`},
		{"array order kept", `[3,1,2]`, `[3,1,2]`},
		{"empty containers", `{"a":{},"b":[],"c":[{}]}`, `{"a":{},"b":[],"c":[{}]}`},
		{"top-level string", `"x"`, `"x"`},
		{"top-level literal", ` true `, `true`},
		{"unneeded escapes undone", `"\u0041\/\u00e9\ud83d\ude00\u007f\u2028"`, "\"A/é😀\x7f\u2028\""},
		{"needed escapes kept", `"\"\\\b\f\n\r\t"`, `"\"\\\b\f\n\r\t"`},
		{"other controls as lowercase \\u00xx", `"\u0000\u001F\u000B"`, `"\u0000\u001f\u000b"`},
		{"raw UTF-8 kept", `"héllo wörld ✓ 𝄞"`, `"héllo wörld ✓ 𝄞"`},
		{"escaped member name", `{"\u0062":1,"a":2}`, `{"a":2,"b":1}`},
		{"integer", `[0,-1,42,123456789012345]`, `[0,-1,42,123456789012345]`},
		{"spellings of one double", `[1.0,1e0,10e-1,0.1e1,100e-2]`, `[1,1,1,1,1]`},
		{"negative zero", `[-0,-0.0,0e5,-0e-5]`, `[0,0,0,0]`},
		{"large integers round to doubles", `[9007199254740993,123456789012345678]`, `[9007199254740992,123456789012345680]`},
		{"exponent notation from 1e21", `[1e20,1e21,1E+22,-1.5e300]`, `[100000000000000000000,1e+21,1e+22,-1.5e+300]`},
		{"exponent notation below 1e-6", `[0.000001,0.0000001,1.5e-7,2e-300]`, `[0.000001,1e-7,1.5e-7,2e-300]`},
		{"shortest digits", `[0.1,0.30000000000000004,3.14159265358979323846]`, `[0.1,0.30000000000000004,3.141592653589793]`},
		{"largest double", `[1.7976931348623157e308,1.7976931348623158e308]`, `[1.7976931348623157e+308,1.7976931348623157e+308]`},
		{"underflow reads as zero like JSON.parse", `[1e-400,-2.4703282292062327e-324,1e-99999999999999999999]`, `[0,0,0]`},
		{"zero with a huge exponent", `0e99999999999999999999`, `0`},
		{"smallest subnormal", `[5e-324,2.4703282292062328e-324]`, `[5e-324,5e-324]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Canonicalize([]byte(tt.given))
			if err != nil {
				t.Fatalf("Canonicalize(%s): %v", tt.given, err)
			}
			if string(got) != tt.want {
				t.Errorf("Canonicalize(%s)\n got: %s\nwant: %s", tt.given, got, tt.want)
			}
		})
	}
}

// invalidBodies are rejected by Canonicalize and by Sum, whatever the Spec.
var invalidBodies = []struct {
	name   string
	given  string
	reason string // part of the error message
	off    string // "at offset N"
}{
	{"empty", ``, "unexpected end", "offset 0"},
	{"only whitespace", " \n", "unexpected end", "offset 2"},
	{"unclosed object", `{"a":1`, "end of input", "offset 6"},
	{"unclosed array", `[1,2`, "end of input", "offset 4"},
	{"trailing comma in array", `[1,]`, "want a value", "offset 3"},
	{"trailing comma in object", `{"a":1,}`, "member name", "offset 7"},
	{"missing colon", `{"a" 1}`, "want ':'", "offset 5"},
	{"name not a string", `{a:1}`, "member name", "offset 1"},
	{"missing comma", `[1 2]`, "want ',' or ']'", "offset 3"},
	{"trailing data", `{} {}`, "data after", "offset 3"},
	{"trailing garbage", `1x`, "data after", "offset 1"},
	{"leading zero", `01`, "data after", "offset 1"},
	{"bare minus", `-`, "digit", "offset 1"},
	{"plus sign", `+1`, "want a value", "offset 0"},
	{"fraction without digits", `1.`, "after the decimal point", "offset 2"},
	{"fraction without integer", `.5`, "want a value", "offset 0"},
	{"exponent without digits", `1e+`, "exponent", "offset 3"},
	{"NaN", `NaN`, "want a value", "offset 0"},
	{"Infinity", `[Infinity]`, "want a value", "offset 1"},
	{"bad literal", `tru`, "literal", "offset 0"},
	{"capitalized literal", `Null`, "want a value", "offset 0"},
	{"single quotes", `'a'`, "want a value", "offset 0"},
	{"unterminated string", `"abc`, "unterminated", "offset 4"},
	{"raw control character", "\"a\tb\"", "control character in a string", "offset 2"},
	{"raw newline in a name", "{\"a\nb\":1}", "control character in a string", "offset 3"},
	{"invalid UTF-8", "\"a\xffb\"", "invalid UTF-8", "offset 2"},
	{"UTF-8 of a surrogate", "\"\xed\xa0\x80\"", "invalid UTF-8", "offset 1"},
	{"overlong UTF-8", "\"\xc0\xaf\"", "invalid UTF-8", "offset 1"},
	{"invalid UTF-8 after an escape", "\"\\n\xff\"", "invalid UTF-8", "offset 3"},
	{"byte order mark", "\xef\xbb\xbf{}", "want a value", "offset 0"},
	{"lone high surrogate", `"\ud800"`, "lone surrogate", "offset 1"},
	{"lone low surrogate", `"\udc00"`, "lone surrogate", "offset 1"},
	{"high surrogate then a letter", `"\ud800\u0041"`, "lone surrogate", "offset 1"},
	{"high surrogate then high surrogate", `"\ud800\ud800"`, "lone surrogate", "offset 1"},
	{"high surrogate at the end", `"\ud800`, "lone surrogate", "offset 1"},
	{"bad escape", `"\x"`, "invalid escape", "offset 1"},
	{"short unicode escape", `"\u12"`, "invalid \\u escape", "offset 1"},
	{"non-hex unicode escape", `"\u12g4"`, "invalid \\u escape", "offset 1"},
	{"duplicate member", `{"a":1,"b":2,"a":3}`, "duplicate member name", "offset"},
	{"duplicate after unescaping", `{"a":1,"\u0061":2}`, "duplicate member name", "offset"},
	{"duplicate deep inside", `[{"x":{"y":[{"k":1,"k":1}]}}]`, "duplicate member name", "offset 19"},
	{"number too large", `1e400`, "out of the range", "offset 0"},
	{"negative number too large", `[-1e309]`, "out of the range", "offset 1"},
	{"just above the largest double", `1.7976931348623159e308`, "out of the range", "offset 0"},
	{"huge exponent", `1e99999999999999999999`, "out of the range", "offset 0"},
	{"too deep arrays", strings.Repeat("[", 513) + strings.Repeat("]", 513), "nesting deeper than 512", "offset 512"},
	{"too deep objects", strings.Repeat(`{"a":`, 513) + "0" + strings.Repeat("}", 513), "nesting deeper than 512", "offset"},
	{"a million brackets", strings.Repeat("[", 1_000_000), "nesting deeper than 512", "offset 512"},
}

func TestCanonicalizeInvalid(t *testing.T) {
	t.Parallel()
	for _, tt := range invalidBodies {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Canonicalize([]byte(tt.given))
			if err == nil {
				t.Fatalf("Canonicalize(%.40q) = %s, want an error", tt.given, got)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			if msg := err.Error(); !strings.Contains(msg, tt.reason) || !strings.Contains(msg, tt.off) {
				t.Errorf("error %q, want it to say %q and %q", msg, tt.reason, tt.off)
			}
		})
	}
}

func TestNestingLimit(t *testing.T) {
	t.Parallel()
	for _, open := range []string{"[", `{"a":`} {
		close := map[string]string{"[": "]", `{"a":`: "}"}[open]
		doc := strings.Repeat(open, maxDepth) + "0" + strings.Repeat(close, maxDepth)
		if _, err := Canonicalize([]byte(doc)); err != nil {
			t.Errorf("%d levels of %s: %v", maxDepth, open, err)
		}
		if _, err := (Spec{}).Sum([]byte(doc)); err != nil {
			t.Errorf("Sum of %d levels of %s: %v", maxDepth, open, err)
		}
	}
}

// TestNameOrder checks the order of member names against a reference that
// sorts by UTF-16 code units directly.
func TestNameOrder(t *testing.T) {
	t.Parallel()
	alphabet := []rune{0, 'a', 'b', 'z', 0x7f, 0xe9, 0x7ff, 0x800, 0xd7ff, 0xe000, 0xfb01, 0xffff, 0x10000, 0x1f600, 0x10ffff}
	rng := rand.New(rand.NewPCG(1, 2))
	name := func() string {
		rs := make([]rune, rng.IntN(12))
		for i := range rs {
			rs[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(rs)
	}
	sign := func(c int) int { return min(max(c, -1), 1) }
	for range 100_000 {
		a, b := name(), name()
		want := slices.Compare(utf16.Encode([]rune(a)), utf16.Encode([]rune(b)))
		got := compareUTF16([]byte(a), []byte(b))
		if ka, kb := sortKey([]byte(a)), sortKey([]byte(b)); ka != kb {
			got = cmp.Compare(ka, kb)
		}
		if sign(got) != want {
			t.Fatalf("%+q vs %+q: got %d, want %d", a, b, got, want)
		}
	}
}
