package fingerprint

import (
	"errors"
	"regexp"
	"slices"
	"sync"
	"testing"
)

func mustSum(t *testing.T, spec Spec, body string) Fingerprint {
	t.Helper()
	fp, err := spec.Sum([]byte(body))
	if err != nil {
		t.Fatalf("Sum(%s): %v", body, err)
	}
	return fp
}

var fingerprintFormat = regexp.MustCompile(`^v1:[0-9a-f]{64}$`)

func TestSumFormat(t *testing.T) {
	t.Parallel()
	fp := mustSum(t, Spec{}, `{"a":1}`)
	if !fingerprintFormat.MatchString(string(fp)) {
		t.Errorf("fingerprint %q is not v1: and 64 lowercase hex digits", fp)
	}
}

// TestSumSame lists bodies that are the same parameters.
func TestSumSame(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		spec Spec
		a, b string
	}{
		{"key order and whitespace", Spec{}, `{"prompt":"cat","n":1,"size":{"w":1,"h":2}}`, " {\"size\" : {\"h\":2,\"w\":1},\n\"n\":1, \"prompt\":\"cat\"}\n"},
		{"escapes that spell the same text", Spec{}, `{"p":"A/é"}`, `{"\u0070":"\u0041\/\u00e9"}`},
		{"1 and 1.0", Spec{}, `{"n":1}`, `{"n":1.0}`},
		{"1 and 1e0", Spec{}, `{"n":1}`, `{"n":1e0}`},
		{"1 and 10e-1", Spec{}, `{"n":1}`, `{"n":10e-1}`},
		{"1 and 0.1E+1", Spec{}, `{"n":1}`, `{"n":0.1E+1}`},
		{"100 and 1e2", Spec{}, `[100]`, `[1e2]`},
		{"trailing zeros of a fraction", Spec{}, `[2.50]`, `[2.5]`},
		{"zero and negative zero", Spec{}, `[0]`, `[-0.0e7]`},
		{"excluded member differs", Spec{Exclude: []string{"/trace"}}, `{"a":1,"trace":"x"}`, `{"a":1,"trace":"y"}`},
		{"excluded member absent", Spec{Exclude: []string{"/trace"}}, `{"a":1,"trace":"x"}`, `{"a":1}`},
		{"excluded nested member", Spec{Exclude: []string{"/meta/trace"}}, `{"meta":{"trace":1,"v":2}}`, `{"meta":{"v":2,"trace":[3]}}`},
		{"excluded array element", Spec{Exclude: []string{"/tags/0"}}, `{"tags":["x","b"]}`, `{"tags":["y","b"]}`},
		{"exclusion that matches nothing", Spec{Exclude: []string{"/nope"}}, `{"a":1}`, `{"a":1}`},
		{"unselected field differs", Spec{Fields: []string{"/prompt"}}, `{"prompt":"p","client_note":"a"}`, `{"client_note":"b","prompt":"p"}`},
		{"selected nested field", Spec{Fields: []string{"/a/b"}}, `{"a":{"b":[1,2],"c":1}}`, `{"a":{"c":2,"b":[1,2]}}`},
		{"selected array element", Spec{Fields: []string{"/images/1"}}, `{"images":["x","y"]}`, `{"images":["z","y","w"]}`},
		{"index with a leading zero names no element", Spec{Fields: []string{"/items/01"}}, `{"items":[1,2]}`, `{"items":[1,3]}`},
		{"~1 is a slash inside a name", Spec{Fields: []string{"/a~1b"}}, `{"a/b":1,"a":{"b":1}}`, `{"a/b":1,"a":{"b":2}}`},
		{"~0 is a tilde inside a name", Spec{Fields: []string{"/m~0n"}}, `{"m~n":1,"m~0n":1}`, `{"m~n":1,"m~0n":2}`},
		{"excluded inside a selected field", Spec{Fields: []string{"/a"}, Exclude: []string{"/a/note"}}, `{"a":{"v":1,"note":"x"}}`, `{"a":{"v":1}}`},
		{"root pointer selects the whole body", Spec{Fields: []string{""}}, `{"a":1,"b":2}`, `{"b":2,"a":1.0}`},
		{"selected field inside a selected field", Spec{Fields: []string{"/a", "/a/b"}}, `{"a":{"b":1,"c":2},"z":1}`, `{"z":2,"a":{"c":2,"b":1}}`},
		{"leading zeros in an exponent", Spec{}, `[0.1]`, `[1e-0000000000000000000001]`},
		{"exponent across the 15-digit boundary", Spec{}, `[1e-1000000000000000]`, `[0.1e-999999999999999]`},
		{"huge exponent and a mantissa that shifts it", Spec{}, `[1e-99999999999999999999]`, `[10e-100000000000000000000]`},
		{"zero with a huge exponent", Spec{}, `[0]`, `[0e99999999999999999999]`},
		{"selected field inside an excluded one is absent", Spec{Fields: []string{"/a/b"}, Exclude: []string{"/a"}}, `{}`, `{"a":{"b":null}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if a, b := mustSum(t, tt.spec, tt.a), mustSum(t, tt.spec, tt.b); a != b {
				t.Errorf("%s and %s have different fingerprints %s and %s", tt.a, tt.b, a, b)
			}
		})
	}
}

// TestSumDifferent lists bodies that are different parameters: the same
// fingerprint for any of these pairs would replay a stale answer.
func TestSumDifferent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		spec Spec
		a, b string
	}{
		{"one more space in a prompt", Spec{}, `{"prompt":"a cat"}`, `{"prompt":"a  cat"}`},
		{"aspect ratio swapped", Spec{}, `{"aspect_ratio":"16:9"}`, `{"aspect_ratio":"9:16"}`},
		{"n 1 and n 2", Spec{}, `{"n":1}`, `{"n":2}`},
		{"integers equal as doubles", Spec{}, `[9007199254740993]`, `[9007199254740992]`},
		{"decimals equal as doubles", Spec{}, `[0.1]`, `[0.10000000000000001]`},
		{"tiny number and zero", Spec{}, `[1e-400]`, `[0]`},
		{"tiny numbers", Spec{}, `[1e-400]`, `[2e-400]`},
		{"huge negative exponents", Spec{}, `[1e-99999999999999999999]`, `[1e-99999999999999999998]`},
		{"number and string", Spec{}, `{"n":1}`, `{"n":"1"}`},
		{"null and false", Spec{}, `{"a":null}`, `{"a":false}`},
		{"empty array and object", Spec{}, `{"a":[]}`, `{"a":{}}`},
		{"array order", Spec{}, `[1,2]`, `[2,1]`},
		{"nesting and a dotted name", Spec{}, `{"a":{"b":1}}`, `{"a.b":1}`},
		{"structure inside a string", Spec{}, `{"a":"1,\"b\":2"}`, `{"a":"1","b":2}`},
		{"absent and null", Spec{Fields: []string{"/a"}}, `{}`, `{"a":null}`},
		{"absent and empty string", Spec{Fields: []string{"/a"}}, `{}`, `{"a":""}`},
		{"value moved to another field", Spec{Fields: []string{"/a", "/b"}}, `{"a":1}`, `{"b":1}`},
		{"value moved between the selected fields", Spec{Fields: []string{"/a", "/b"}}, `{"a":1,"b":2}`, `{"a":2,"b":1}`},
		{"selected field changed", Spec{Fields: []string{"/prompt"}}, `{"prompt":"cat"}`, `{"prompt":"dog"}`},
		{"nested selected field changed", Spec{Fields: []string{"/a/b"}}, `{"a":{"b":1}}`, `{"a":{"b":2}}`},
		{"selected element changed", Spec{Fields: []string{"/images/0"}}, `{"images":["x"]}`, `{"images":["y"]}`},
		{"exclusion only at its own path", Spec{Exclude: []string{"/trace"}}, `{"x":{"trace":1}}`, `{"x":{"trace":2}}`},
		{"excluded element shifts nothing", Spec{Exclude: []string{"/tags/0"}}, `{"tags":["x","a","b"]}`, `{"tags":["x","b","a"]}`},
		{"escaped text differs", Spec{}, `{"p":"\u0041"}`, `{"p":"\u0042"}`},
		{"exponents one apart across the 15-digit boundary", Spec{}, `[1e-1000000000000000]`, `[1e-999999999999999]`},
		{"huge exponents, mantissas differ", Spec{}, `[1e-99999999999999999999]`, `[1.0000000000000000000001e-99999999999999999999]`},
		{"mantissa digits beyond a double", Spec{}, `[123456789012345678901234567890]`, `[123456789012345678901234567891]`},
		{"combining sequence and precomposed letter", Spec{}, `{"p":"e\u0301"}`, `{"p":"\u00e9"}`},
		{"escaped NUL and nothing", Spec{}, `{"p":"\u0000"}`, `{"p":""}`},
		{"escaped and raw backslash-u", Spec{}, `{"p":"\u0041"}`, `{"p":"\\u0041"}`},
		{"excluded element inside a selected field", Spec{Fields: []string{"/a"}, Exclude: []string{"/a/0"}}, `{"a":[1,2]}`, `{"a":[2]}`},
		{"object member and array element at /0", Spec{Fields: []string{"/0"}}, `{"0":"x"}`, `["x"]`},
		{"object member and array element inside", Spec{Fields: []string{"/items/1/sku"}}, `{"items":{"1":{"sku":"a"}}}`, `{"items":[{"sku":"b"},{"sku":"a"}]}`},
		{"object member and array element, deepest token", Spec{Fields: []string{"/a/0"}}, `{"a":{"0":1}}`, `{"a":[1]}`},
		{"object member and array element, first token", Spec{Fields: []string{"/0/k"}}, `{"0":{"k":1}}`, `[{"k":1}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if a, b := mustSum(t, tt.spec, tt.a), mustSum(t, tt.spec, tt.b); a == b {
				t.Errorf("%s and %s share the fingerprint %s", tt.a, tt.b, a)
			}
		})
	}
}

func TestSumSpecOrderDoesNotMatter(t *testing.T) {
	t.Parallel()
	body := `{"a":1,"b":2,"c":3}`
	want := mustSum(t, Spec{Fields: []string{"/a", "/b"}}, body)
	for _, fields := range [][]string{{"/b", "/a"}, {"/a", "/b", "/a"}} {
		if got := mustSum(t, Spec{Fields: fields}, body); got != want {
			t.Errorf("Fields %q: %s, want %s as for [/a /b]", fields, got, want)
		}
	}
}

func TestSumInvalidBody(t *testing.T) {
	t.Parallel()
	specs := []Spec{{}, {Fields: []string{"/a"}}, {Exclude: []string{"/a"}}}
	for _, tt := range invalidBodies {
		if tt.given == "" {
			continue // the empty body is a request of its own for Sum: TestEmptyBody
		}
		for _, spec := range specs {
			fp, err := spec.Sum([]byte(tt.given))
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%s: %+v.Sum = %q, %v; want an error wrapping ErrInvalid", tt.name, spec, fp, err)
			}
		}
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		given   Spec
		wantErr bool
	}{
		{"zero Spec", Spec{}, false},
		{"plain pointers", Spec{Fields: []string{"/prompt", "/size/0", "/a/b/c"}, Exclude: []string{"/note"}}, false},
		{"escapes", Spec{Fields: []string{"/a~0b", "/a~1b", "/~01"}}, false},
		{"root field", Spec{Fields: []string{""}}, false},
		{"empty name", Spec{Fields: []string{"/", "//"}}, false},
		{"no leading slash", Spec{Fields: []string{"prompt"}}, true},
		{"tilde at the end", Spec{Fields: []string{"/a~"}}, true},
		{"tilde then 2", Spec{Exclude: []string{"/~2"}}, true},
		{"excluding the whole body", Spec{Exclude: []string{""}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.given.Validate()
			if (err != nil) != tt.wantErr {
				t.Fatalf("Validate() = %v, want error %t", err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			_, sumErr := tt.given.Sum([]byte(`{}`))
			if (sumErr != nil) != tt.wantErr {
				t.Errorf("Sum error %v, want error %t as Validate", sumErr, tt.wantErr)
			}
		})
	}
}

func TestPointerTokens(t *testing.T) {
	t.Parallel()
	toks, err := appendTokens(nil, "/a~1b/~01/0/-/10/01/")
	if err != nil {
		t.Fatal(err)
	}
	want := []token{{"a/b", -1}, {"~1", -1}, {"0", 0}, {"-", -1}, {"10", 10}, {"01", -1}, {"", -1}}
	if !slices.Equal(toks, want) {
		t.Errorf("tokens %+v, want %+v", toks, want)
	}
}

// exactForm returns the hash form Sum gives a body.
func exactForm(t *testing.T, body string) string {
	t.Helper()
	st := getState()
	defer putState(st)
	st.out = st.out[:0]
	if err := st.scan([]byte(body), numbersExact); err != nil {
		t.Fatalf("scan(%s): %v", body, err)
	}
	return string(st.canonical(nil, 0))
}

func TestExactNumbers(t *testing.T) {
	t.Parallel()
	tests := []struct{ given, want string }{
		{"0", "0"}, {"-0.000e-9", "0"}, {"1", "1e0"}, {"-1", "-1e0"}, {"1.0", "1e0"},
		{"10", "1e1"}, {"1200", "1.2e3"}, {"0.001", "1e-3"}, {"0.00120", "1.2e-3"},
		{"123.456", "1.23456e2"}, {"-9007199254740993", "-9.007199254740993e15"},
		{"12e-5", "1.2e-4"}, {"0.5E+3", "5e2"},
		{"1.7976931348623157e308", "1.7976931348623157e308"},
		{"1e-99999999999999999999", "1e-99999999999999999999"},
		{"0.0012e-99999999999999999999", "1.2e-100000000000000000002"},
	}
	for _, tt := range tests {
		if got := exactForm(t, tt.given); got != tt.want {
			t.Errorf("%s: exact form %s, want %s", tt.given, got, tt.want)
		}
	}
}

func TestSumConcurrent(t *testing.T) {
	t.Parallel()
	bodies := []string{`{"a":1,"b":[1,2,{"c":"d"}]}`, `[1.5,"x",null]`, `{"prompt":"cat","n":2}`}
	want := make([]Fingerprint, len(bodies))
	for i, b := range bodies {
		want[i] = mustSum(t, Spec{Fields: []string{"/a", "/prompt"}}, b)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				k := (g + i) % len(bodies)
				got, err := Spec{Fields: []string{"/prompt", "/a"}}.Sum([]byte(bodies[k]))
				if err != nil || got != want[k] {
					t.Errorf("concurrent Sum(%s) = %s, %v; want %s", bodies[k], got, err, want[k])
					return
				}
			}
		})
	}
	wg.Wait()
}
