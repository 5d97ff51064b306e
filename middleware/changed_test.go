package middleware_test

import (
	"encoding/json"
	"net/http"
	"reflect"
	"testing"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/middleware"
)

// TestChanged: key_reused names the selected fields that changed (pointer
// names, never values), when the Spec selects fields; it says nothing more
// when only the route, query or the whole body differ.
func TestChanged(t *testing.T) {
	t.Parallel()
	fields := fingerprint.Spec{Fields: []string{"/prompt", "/aspect_ratio", "/n"}}
	tests := []struct {
		name        string
		spec        fingerprint.Spec
		given, when req
		wantChanged []string // nil: no "changed" member
	}{
		{"prompt", fields,
			req{key: "k", body: imageBody},
			req{key: "k", body: `{"prompt":"a red fox ","aspect_ratio":"16:9","n":1}`}, []string{"/prompt"}},
		{"two fields", fields,
			req{key: "k", body: imageBody},
			req{key: "k", body: `{"prompt":"a red fox","aspect_ratio":"9:16","n":2}`}, []string{"/aspect_ratio", "/n"}},
		{"field removed", fields,
			req{key: "k", body: imageBody},
			req{key: "k", body: `{"prompt":"a red fox","n":1}`}, []string{"/aspect_ratio"}},
		{"form", fields,
			req{key: "k", ctype: "application/x-www-form-urlencoded", body: "prompt=a&n=1&aspect_ratio=1%3A1"},
			req{key: "k", ctype: "application/x-www-form-urlencoded", body: "prompt=b&n=1&aspect_ratio=1%3A1"}, []string{"/prompt"}},
		{"query only", fields,
			req{key: "k", body: imageBody},
			req{key: "k", path: "/v1/images?dry_run=true", body: imageBody}, nil},
		{"whole body", fingerprint.Spec{},
			req{key: "k", body: imageBody},
			req{key: "k", body: `{"prompt":"a red fox ","aspect_ratio":"16:9","n":1}`}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := newEnv(t, func(c *middleware.Config) { c.Fingerprint = tc.spec }, nil)
			if rec := v.do(tc.given); rec.Code != http.StatusCreated {
				t.Fatalf("first request = %d %s", rec.Code, rec.Body)
			}
			rec := v.do(tc.when)
			if rec.Code != http.StatusConflict || problemCode(t, rec) != "key_reused" {
				t.Fatalf("drifted request = %d %s, want 409 key_reused", rec.Code, rec.Body)
			}
			var p struct {
				Changed []string `json:"changed"`
				Run     any      `json:"run"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(p.Changed, tc.wantChanged) || p.Run != nil {
				t.Errorf("problem %s: changed %q, want %q", rec.Body, p.Changed, tc.wantChanged)
			}
			if v.calls.Load() != 1 {
				t.Errorf("handler ran %d times", v.calls.Load())
			}
		})
	}
}
