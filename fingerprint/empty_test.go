package fingerprint

import (
	"errors"
	"testing"
)

// TestEmptyBody: a request without a body (POST /orders/1/cancel) is a
// valid request of its own, for Sum and for SumRequest, with or without
// Fields: not {}, not null, not the same empty body under another media
// type. Whitespace is not empty: it is invalid JSON.
func TestEmptyBody(t *testing.T) {
	t.Parallel()
	for _, spec := range []Spec{{}, {Fields: []string{"/a"}}, {Exclude: []string{"/a"}}, {Fields: []string{""}}} {
		empty, err := spec.Sum(nil)
		if err != nil {
			t.Fatalf("%+v: Sum(empty): %v", spec, err)
		}
		if !fingerprintFormat.MatchString(string(empty)) {
			t.Errorf("%+v: Sum(empty) = %q", spec, empty)
		}
		for _, other := range []string{`{}`, `null`, `""`, `[]`} {
			if fp := mustSum(t, spec, other); fp == empty {
				t.Errorf("%+v: the empty body and %s share the fingerprint %s", spec, other, fp)
			}
		}
		if got := sumRequest(t, spec, body{"application/json", ""}); got != empty {
			t.Errorf("%+v: SumRequest(application/json, empty) = %s, Sum(empty) = %s", spec, got, empty)
		}
		if _, err := spec.Sum([]byte(" ")); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: Sum(\" \") = %v, want an error wrapping ErrInvalid", spec, err)
		}
	}
	// The media type still takes part.
	seen := map[Fingerprint]string{}
	for _, ct := range []string{"application/json", "application/merge-patch+json", formType, "multipart/form-data; boundary=b", "text/plain", ""} {
		fp := sumRequest(t, Spec{Fields: []string{"/a"}}, body{ct, ""})
		if other, ok := seen[fp]; ok {
			t.Errorf("empty bodies as %q and %q share %s", ct, other, fp)
		}
		seen[fp] = ct
	}
	// An empty form is the empty body too: echo binds nothing from either.
	if _, err := Canonicalize(nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("Canonicalize(empty) = %v, want an error: the empty body is not JSON", err)
	}
}
