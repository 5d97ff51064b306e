package fingerprint

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// benchDoc returns a JSON document of about size bytes shaped like API
// traffic: objects with unsorted member names, strings (some escaped, some
// non-ASCII), integers, decimals, booleans, nulls and nested arrays.
func benchDoc(size int) []byte {
	var b strings.Builder
	b.WriteString(`{"request_id":"7f3c9a2e-1b4d-4e8a-9c6f-2d5b8e1a7c30","prompt":"A lighthouse at dusk, oil painting, \"warm\" light","n":2,"items":[`)
	for i := 0; b.Len() < size-120; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"sku":"SKU-%06d","name":"Café crème n°%d","qty":%d,"price":%s,"tags":["a","b%d"],"gift":%t,"note":null,"dims":{"w":%d.5,"h":1e%d}}`,
			i, i, i%7+1, strconv.FormatFloat(float64(i)*1.25+0.01, 'f', -1, 64), i%3, i%2 == 0, i%40, i%9)
	}
	b.WriteString(`],"aspect_ratio":"16:9"}`)
	return []byte(b.String())
}

var benchSizes = []struct {
	name string
	size int
}{
	{"1KB", 1 << 10},
	{"64KB", 64 << 10},
	{"1MB", 1 << 20},
}

// BenchmarkSum compares, per document size, Sum with the floor (json.Valid
// and SHA-256 of the same bytes) and with an encoding/json round trip
// (Unmarshal into any, Marshal, SHA-256).
func BenchmarkSum(b *testing.B) {
	for _, sz := range benchSizes {
		doc := benchDoc(sz.size)
		if _, err := (Spec{}).Sum(doc); err != nil {
			b.Fatal(err)
		}
		b.Run(sz.name+"/Sum", func(b *testing.B) {
			b.SetBytes(int64(len(doc)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := (Spec{}).Sum(doc); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(sz.name+"/floor", func(b *testing.B) {
			b.SetBytes(int64(len(doc)))
			b.ReportAllocs()
			for b.Loop() {
				if !json.Valid(doc) {
					b.Fatal("invalid")
				}
				_ = sha256.Sum256(doc)
			}
		})
		b.Run(sz.name+"/encoding-json", func(b *testing.B) {
			b.SetBytes(int64(len(doc)))
			b.ReportAllocs()
			for b.Loop() {
				var v any
				if err := json.Unmarshal(doc, &v); err != nil {
					b.Fatal(err)
				}
				out, err := json.Marshal(v)
				if err != nil {
					b.Fatal(err)
				}
				_ = sha256.Sum256(out)
			}
		})
	}
}

// BenchmarkSumFields measures a Spec that selects and excludes fields.
func BenchmarkSumFields(b *testing.B) {
	doc := benchDoc(1 << 10)
	spec := Spec{Fields: []string{"/prompt", "/n", "/aspect_ratio", "/items/0"}, Exclude: []string{"/request_id"}}
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := spec.Sum(doc); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCanonicalize measures the RFC 8785 form of a 1 KB document.
func BenchmarkCanonicalize(b *testing.B) {
	doc := benchDoc(1 << 10)
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Canonicalize(doc); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSumRequest measures the path the middleware takes for a 1 KB
// JSON request, with the Spec compiled per call (spec) and once (compiled,
// as the middleware does).
func BenchmarkSumRequest(b *testing.B) {
	doc := benchDoc(1 << 10)
	r := httptest.NewRequest("POST", "/v1/images", nil)
	r.Header.Set("Content-Type", "application/json; charset=utf-8")
	spec := Spec{Fields: []string{"/prompt", "/n", "/aspect_ratio", "/items"}}
	c, err := spec.Compile()
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		sum  func() (Fingerprint, error)
	}{
		{"spec", func() (Fingerprint, error) { return spec.SumRequest(r, doc) }},
		{"compiled", func() (Fingerprint, error) { return c.SumRequest(r, doc) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(doc)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bc.sum(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestSumAllocs holds Sum to its allocation budget at 1 KB: the returned
// string, and the pooled buffers otherwise.
func TestSumAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops pooled buffers on purpose")
	}
	doc := benchDoc(1 << 10)
	for _, spec := range []Spec{{}, {Fields: []string{"/prompt", "/items/0"}, Exclude: []string{"/request_id"}}} {
		allocs := testing.AllocsPerRun(200, func() {
			if _, err := spec.Sum(doc); err != nil {
				t.Fatal(err)
			}
		})
		if allocs > 8 {
			t.Errorf("%+v: Sum of 1 KB makes %.1f allocations, want at most 8", spec, allocs)
		}
	}
	// docs/performance.md's fingerprint table gives Sum one allocation,
	// the returned string, at 1 KB and 64 KB (1 MB is left out: the
	// collector may empty the pool between runs of a buffer that large).
	for _, size := range []int{1 << 10, 64 << 10} {
		doc := benchDoc(size)
		allocs := testing.AllocsPerRun(50, func() {
			if _, err := (Spec{}).Sum(doc); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 1 {
			t.Errorf("Sum of %d KB makes %.1f allocations, want 1 (docs/performance.md)", size>>10, allocs)
		}
	}
}
