package fingerprint_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/fingerprint"
)

// TestSumRequestFields: one FieldSum per configured pointer, in Spec order;
// a sum changes exactly where the field's value (or presence) changes.
func TestSumRequestFields(t *testing.T) {
	t.Parallel()
	spec := fingerprint.Spec{Fields: []string{"/prompt", "/n", "/aspect_ratio"}}
	const base = `{"prompt":"a lighthouse","n":1,"aspect_ratio":"16:9","note":"x"}`
	tests := []struct {
		name        string
		contentType string
		given       string
		when        string
		wantChanged []int // indexes into spec.Fields
	}{
		{"same", "application/json", base, `{"aspect_ratio":"16:9", "n":1.0,"prompt":"a lighthouse","note":"y"}`, nil},
		{"prompt", "application/json", base, `{"prompt":"a lighthouse ","n":1,"aspect_ratio":"16:9"}`, []int{0}},
		{"two", "application/json", base, `{"prompt":"a lighthouse","n":2,"aspect_ratio":"9:16"}`, []int{1, 2}},
		{"absent vs null", "application/json", `{"prompt":null,"n":1,"aspect_ratio":"16:9"}`, `{"n":1,"aspect_ratio":"16:9"}`, []int{0}},
		{"form", "application/x-www-form-urlencoded", "prompt=a&n=1&aspect_ratio=16%3A9", "n=1&prompt=b&aspect_ratio=16%3A9", []int{0}},
		{"form same", "application/x-www-form-urlencoded", "prompt=a&n=1", "n=1&prompt=a", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := sums(t, spec, tc.contentType, tc.given)
			b := sums(t, spec, tc.contentType, tc.when)
			var changed []int
			for i := range a {
				if a[i] != b[i] {
					changed = append(changed, i)
				}
			}
			if len(changed) != len(tc.wantChanged) {
				t.Fatalf("changed = %v, want %v", changed, tc.wantChanged)
			}
			for i := range changed {
				if changed[i] != tc.wantChanged[i] {
					t.Fatalf("changed = %v, want %v", changed, tc.wantChanged)
				}
			}
		})
	}
}

func sums(t *testing.T, spec fingerprint.Spec, contentType, body string) []fingerprint.FieldSum {
	t.Helper()
	r, _ := http.NewRequest(http.MethodPost, "/", strings.NewReader(body))
	r.Header.Set("Content-Type", contentType)
	fp, got, err := spec.SumRequestFields(r, []byte(body), nil)
	if err != nil {
		t.Fatalf("SumRequestFields(%s): %v", body, err)
	}
	want, err := spec.SumRequest(r, []byte(body))
	if err != nil || fp != want {
		t.Fatalf("fingerprint %s differs from SumRequest's %s (%v)", fp, want, err)
	}
	if len(got) != len(spec.Fields) {
		t.Fatalf("got %d sums for %d fields", len(got), len(spec.Fields))
	}
	return got
}

// TestSumRequestFieldsNone: no per-field sums where fields are not selected
// one by one.
func TestSumRequestFieldsNone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, contentType, body string
		spec                    fingerprint.Spec
	}{
		{"whole body", "application/json", `{"a":1}`, fingerprint.Spec{}},
		{"root pointer", "application/json", `{"a":1}`, fingerprint.Spec{Fields: []string{"", "/a"}}},
		{"empty body", "application/json", ``, fingerprint.Spec{Fields: []string{"/a"}}},
		{"raw", "text/plain", `a=1`, fingerprint.Spec{Fields: []string{"/a"}}},
	} {
		r, _ := http.NewRequest(http.MethodPost, "/", strings.NewReader(tc.body))
		r.Header.Set("Content-Type", tc.contentType)
		_, got, err := tc.spec.SumRequestFields(r, []byte(tc.body), nil)
		if err != nil || len(got) != 0 {
			t.Errorf("%s: %d sums, err %v; want none", tc.name, len(got), err)
		}
	}
}
