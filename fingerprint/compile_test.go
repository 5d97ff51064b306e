package fingerprint

import (
	"errors"
	"fmt"
	"mime"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
)

// compileSpecs are Specs a route may hold: none, fields (repeated, out of
// order, the whole body among them), exclusions, escaped tokens.
var compileSpecs = []Spec{
	{},
	{Fields: []string{"/prompt", "/n"}},
	{Fields: []string{"/n", "/prompt", "/n", "/size/0"}},
	{Fields: []string{"/prompt", ""}},
	{Exclude: []string{"/client_note"}},
	{Fields: []string{"/a~1b", "/prompt"}, Exclude: []string{"/prompt/x", "/client_note"}},
}

func compileBodies(t *testing.T) []body {
	return []body{
		{"application/json", `{"prompt":"a fox","n":1,"size":[512,512],"client_note":"x","a/b":true}`},
		{"application/json; charset=utf-8", `{ "n": 1.0, "prompt": "a fox" }`},
		{"application/merge-patch+json", `{"prompt":null}`},
		{"application/json", ``},
		{"application/json", `{"prompt":"a fox","Prompt":"b"}`}, // folds onto a selected name
		{"application/json", `{"prompt":`},
		{"application/x-www-form-urlencoded", "prompt=a+fox&n=1&client_note=x"},
		multipartBody(t, "b0undary", part{name: "prompt", data: "a fox"}, part{name: "image", filename: "a.png", data: "PNG"}),
		{"text/plain; charset=UTF-8", "a fox"},
		{"", "a fox"},
		{"Application/JSON", `{"prompt":"a fox"}`},
	}
}

// TestCompiledAgrees: a Compiled gives what its Spec gives, fingerprint,
// field sums and error alike, for every kind of body.
func TestCompiledAgrees(t *testing.T) {
	t.Parallel()
	for _, spec := range compileSpecs {
		c, err := spec.Compile()
		if err != nil {
			t.Fatalf("Compile(%+v): %v", spec, err)
		}
		for _, b := range compileBodies(t) {
			r := httptest.NewRequest("POST", "/v1/images", nil)
			if b.contentType != "" {
				r.Header.Set("Content-Type", b.contentType)
			}
			name := fmt.Sprintf("%+v %q %q", spec, b.contentType, b.data)
			want, wantSums, wantErr := spec.SumRequestFields(r, []byte(b.data), nil)
			got, gotSums, gotErr := c.SumRequestFields(r, []byte(b.data), nil)
			if got != want || !slices.Equal(gotSums, wantSums) || fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
				t.Errorf("%s: Compiled %v %v %v, Spec %v %v %v", name, got, gotSums, gotErr, want, wantSums, wantErr)
			}
			if got, err := c.SumRequest(r, []byte(b.data)); got != want || fmt.Sprint(err) != fmt.Sprint(wantErr) {
				t.Errorf("%s: Compiled.SumRequest %v %v, want %v %v", name, got, err, want, wantErr)
			}
			want, wantErr = spec.Sum([]byte(b.data))
			if got, err := c.Sum([]byte(b.data)); got != want || fmt.Sprint(err) != fmt.Sprint(wantErr) {
				t.Errorf("%s: Compiled.Sum %v %v, want %v %v", name, got, err, want, wantErr)
			}
		}
	}
}

// TestCompileRejects: Compile refuses what Validate refuses, with the same error.
func TestCompileRejects(t *testing.T) {
	t.Parallel()
	for _, spec := range []Spec{
		{Fields: []string{"prompt"}},
		{Fields: []string{"/a~2"}},
		{Exclude: []string{""}},
	} {
		c, err := spec.Compile()
		if c != nil || !errors.Is(err, ErrInvalid) || err.Error() != spec.Validate().Error() {
			t.Errorf("Compile(%+v) = %v, %v; want nil and Validate's error %v", spec, c, err, spec.Validate())
		}
	}
}

// TestCompiledKeepsItsSpec: changing the Spec's slices after Compile
// changes nothing the Compiled computes.
func TestCompiledKeepsItsSpec(t *testing.T) {
	t.Parallel()
	spec := Spec{Fields: []string{"/prompt", "/n"}, Exclude: []string{"/client_note"}}
	c, err := spec.Compile()
	if err != nil {
		t.Fatal(err)
	}
	doc := []byte(`{"prompt":"a fox","n":1,"client_note":"x"}`)
	want, _ := spec.Sum(doc)
	spec.Fields[0], spec.Fields[1], spec.Exclude[0] = "/n", "/client_note", "/prompt"
	if got, err := c.Sum(doc); got != want || err != nil {
		t.Errorf("after the Spec changed: %v %v, want %v", got, err, want)
	}
}

// TestCompiledConcurrent: one Compiled serves many goroutines at once
// (run with -race), each getting its own body's fingerprint.
func TestCompiledConcurrent(t *testing.T) {
	t.Parallel()
	spec := Spec{Fields: []string{"/prompt", "/n"}, Exclude: []string{"/client_note"}}
	c, err := spec.Compile()
	if err != nil {
		t.Fatal(err)
	}
	docs := make([][]byte, 8)
	want := make([]Fingerprint, len(docs))
	for i := range docs {
		docs[i] = fmt.Appendf(nil, `{"prompt":"fox %d","n":%d,"client_note":"x"}`, i, i)
		want[i], _ = spec.Sum(docs[i])
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				k := (g + i) % len(docs)
				if got, err := c.Sum(docs[k]); got != want[k] || err != nil {
					t.Errorf("goroutine %d body %d: %v %v, want %v", g, k, got, err, want[k])
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestPlainMediaType: the Content-Types read without mime.ParseMediaType
// are exactly those it returns unchanged, with no parameters.
func TestPlainMediaType(t *testing.T) {
	t.Parallel()
	for _, ct := range []string{
		"application/json", "application/x-www-form-urlencoded", "multipart/form-data",
		"application/vnd.api+json", "text/plain", "a/b", "x-._~!#$%&'*+^`|/y",
		"Application/json", "application/JSON", " application/json", "application/json ",
		"application/json;", "application/json; charset=utf-8", "application", "/json",
		"application/", "application//json", "appli cation/json", "application/{json}",
		"application/json\x00", "application/jsön", "",
	} {
		plain := isPlainMediaType(ct)
		typ, params, err := mime.ParseMediaType(ct)
		if same := err == nil && typ == ct && len(params) == 0; plain && !same {
			t.Errorf("%q: read as plain, mime.ParseMediaType says %q %v %v", ct, typ, params, err)
		}
		if mt, err := parseMediaType(ct); plain && (err != nil || mt.typ != ct || mt.bad || len(mt.params) != 0) {
			t.Errorf("%q: parseMediaType = %+v, %v", ct, mt, err)
		}
	}
	for _, ct := range []string{"application/json", "application/x-www-form-urlencoded", "text/plain"} {
		if !isPlainMediaType(ct) {
			t.Errorf("%q is not read as plain", ct)
		}
	}
}

// TestCompiledAllocs: with the Spec compiled once, a JSON request with
// selected fields costs one allocation, the fingerprint string, and never
// more than the Spec's own SumRequestFields.
func TestCompiledAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops pooled buffers on purpose")
	}
	spec := Spec{Fields: []string{"/prompt", "/aspect_ratio", "/n", "/reference_image"}}
	c, err := spec.Compile()
	if err != nil {
		t.Fatal(err)
	}
	doc := []byte(`{"prompt":"a lighthouse at dusk","aspect_ratio":"16:9","n":1,"client_note":"x"}`)
	r := httptest.NewRequest("POST", "/v1/images", nil)
	r.Header.Set("Content-Type", "application/json")
	dst := make([]FieldSum, 0, 4)
	compiled := testing.AllocsPerRun(200, func() {
		if _, _, err := c.SumRequestFields(r, doc, dst[:0]); err != nil {
			t.Fatal(err)
		}
	})
	perCall := testing.AllocsPerRun(200, func() {
		if _, _, err := spec.SumRequestFields(r, doc, dst[:0]); err != nil {
			t.Fatal(err)
		}
	})
	if compiled > 1 || compiled > perCall {
		t.Errorf("Compiled.SumRequestFields allocates %.1f times (Spec's %.1f), want at most 1", compiled, perCall)
	}
}
