package middleware_test

import (
	"bytes"
	"mime/multipart"
	"net/textproto"
	"testing"

	"github.com/idemgate/idemgate/fingerprint"
)

// quirky is bound by the handler of TestAttackBinderQuirks: ASCII names,
// a non-ASCII one with a special fold (ß, ẞ U+1E9E), Greek sigma (σ, ς,
// Σ fold together), a slice, and a file.
type quirky struct {
	Prompt string   `json:"prompt" form:"prompt"`
	Straße string   `json:"straße" form:"straße"`
	Sigma  string   `json:"σ" form:"σ"`
	Images []string `json:"images" form:"images"`
	Note   string   `json:"note" form:"note"`
}

func multipartOf(t *testing.T, parts ...[3]string) (string, string) {
	t.Helper()
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	w.SetBoundary("quirk")
	for _, p := range parts {
		h := textproto.MIMEHeader{}
		if p[1] != "" {
			h.Set("Content-Disposition", `form-data; name="`+p[0]+`"; filename="`+p[1]+`"`)
		} else {
			h.Set("Content-Disposition", `form-data; name="`+p[0]+`"`)
		}
		pw, _ := w.CreatePart(h)
		pw.Write([]byte(p[2]))
	}
	w.Close()
	return w.FormDataContentType(), b.String()
}

// TestAttackBinderQuirks: pairs of requests that a careless reading of
// encoding/json or echo's binders could let share a fingerprint while the
// handler binds other values. Each held on the code of 068b6a6: the
// second is refused or runs, never replayed.
func TestAttackBinderQuirks(t *testing.T) {
	t.Parallel()
	const form = "application/x-www-form-urlencoded"
	selected := fingerprint.Spec{Fields: []string{"/prompt", "/straße", "/σ", "/images"}}
	mpType, mpAB := multipartOf(t, [3]string{"images", "", "a"}, [3]string{"images", "i.png", "x"}, [3]string{"images", "", "b"})
	_, mpBA := multipartOf(t, [3]string{"images", "", "b"}, [3]string{"images", "i.png", "x"}, [3]string{"images", "", "a"})
	_, mpFileFirst := multipartOf(t, [3]string{"images", "i.png", "x"}, [3]string{"images", "", "b"}, [3]string{"images", "", "a"})
	tests := []struct {
		name          string
		spec          fingerprint.Spec
		first, second req
	}{
		{"escaped folded name", selected,
			req{path: "/v1/tasks", key: "k", body: `{"prompt":"x"}`},
			req{path: "/v1/tasks", key: "k", body: `{"prompt":"x","\u0050rompt":"y"}`}},
		{"name with a NUL is another name, not bound", selected,
			req{path: "/v1/tasks", key: "k", body: `{"prompt":"x"}`},
			req{path: "/v1/tasks", key: "k", body: `{"prompt\u0000":"x"}`}},
		{"capital sharp s folds onto ß", selected,
			req{path: "/v1/tasks", key: "k", body: `{"straße":"a"}`},
			req{path: "/v1/tasks", key: "k", body: `{"straße":"a","STRAẞE":"b"}`}},
		{"final sigma folds onto σ", selected,
			req{path: "/v1/tasks", key: "k", body: `{"σ":"a"}`},
			req{path: "/v1/tasks", key: "k", body: `{"σ":"a","ς":"b"}`}},
		{"capital sigma, whole body, swapped", fingerprint.Spec{},
			req{path: "/v1/tasks", key: "k", body: `{"σ":"a","Σ":"b"}`},
			req{path: "/v1/tasks", key: "k", body: `{"Σ":"b","σ":"a"}`}},
		{"percent-encoded folded form name", selected,
			req{path: "/v1/tasks", key: "k", ctype: form, body: "prompt=x"},
			req{path: "/v1/tasks", key: "k", ctype: form, body: "prompt=x&%50rompt=y&note=1"}},
		{"form body merged with the URL query", selected,
			req{path: "/v1/tasks", key: "k", ctype: form, body: "note=1"},
			req{path: "/v1/tasks?prompt=y", key: "k", ctype: form, body: "note=1"}},
		{"form repeated values reordered", selected,
			req{path: "/v1/tasks", key: "k", ctype: form, body: "images=a&images=b"},
			req{path: "/v1/tasks", key: "k", ctype: form, body: "images=b&images=a"}},
		{"multipart: text values of a name around a file part, reordered", selected,
			req{path: "/v1/tasks", key: "k", ctype: mpType, body: mpAB},
			req{path: "/v1/tasks", key: "k", ctype: mpType, body: mpBA}},
		{"multipart: file part moved, text values reordered", selected,
			req{path: "/v1/tasks", key: "k", ctype: mpType, body: mpAB},
			req{path: "/v1/tasks", key: "k", ctype: mpType, body: mpFileFirst}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := attackEnv[quirky](t, tt.spec)
			checkNoFalseReplay[quirky](t, v, tt.first, tt.second)
		})
	}
}
