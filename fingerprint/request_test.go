package fingerprint

import (
	"bytes"
	"errors"
	"mime/multipart"
	"net/http/httptest"
	"net/textproto"
	"testing"
)

// A body is a request body and its Content-Type.
type body struct {
	contentType string
	data        string
}

func sumRequest(t *testing.T, spec Spec, b body) Fingerprint {
	t.Helper()
	r := httptest.NewRequest("POST", "/v1/images", nil)
	if b.contentType != "" {
		r.Header.Set("Content-Type", b.contentType)
	}
	fp, err := spec.SumRequest(r, []byte(b.data))
	if err != nil {
		t.Fatalf("SumRequest(%q, %q): %v", b.contentType, b.data, err)
	}
	return fp
}

// part is one part of a multipart body; a file when filename is set.
type part struct{ name, filename, data string }

func multipartBody(t *testing.T, boundary string, parts ...part) body {
	t.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	if err := w.SetBoundary(boundary); err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		h := textproto.MIMEHeader{}
		if p.filename != "" {
			h.Set("Content-Disposition", `form-data; name="`+p.name+`"; filename="`+p.filename+`"`)
			h.Set("Content-Type", "image/png")
		} else {
			h.Set("Content-Disposition", `form-data; name="`+p.name+`"`)
		}
		pw, err := w.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		pw.Write([]byte(p.data))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return body{w.FormDataContentType(), buf.String()}
}

// rawPart is a multipart part with its Content-Disposition and
// Content-Type as written.
type rawPart struct{ disposition, contentType, data string }

func partsBody(t *testing.T, boundary string, parts ...rawPart) body {
	t.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	if err := w.SetBoundary(boundary); err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		h := textproto.MIMEHeader{"Content-Disposition": {p.disposition}}
		if p.contentType != "" {
			h["Content-Type"] = []string{p.contentType}
		}
		pw, err := w.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		pw.Write([]byte(p.data))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return body{w.FormDataContentType(), buf.String()}
}

func TestSumRequestJSONIsSum(t *testing.T) {
	t.Parallel()
	spec := Spec{Fields: []string{"/prompt"}}
	want := mustSum(t, spec, `{"prompt":"cat"}`)
	for _, ct := range []string{"application/json", "application/json; charset=utf-8", "Application/JSON ; charset=UTF-8"} {
		if got := sumRequest(t, spec, body{ct, `{"prompt":"cat"}`}); got != want {
			t.Errorf("Content-Type %q: %s, want %s as from Sum", ct, got, want)
		}
	}
}

func TestSumRequestSame(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		spec Spec
		a, b body
	}{
		{"+json key order", Spec{}, body{"application/vnd.api+json", `{"a":1,"b":2}`}, body{"application/vnd.api+json", `{"b":2,"a":1.0}`}},
		{"form field order", Spec{}, body{"application/x-www-form-urlencoded", "a=1&b=2"}, body{"application/x-www-form-urlencoded", "b=2&a=1"}},
		{"form spellings of a space", Spec{}, body{"application/x-www-form-urlencoded", "p=a+cat"}, body{"application/x-www-form-urlencoded", "p=a%20cat"}},
		{"form excluded field", Spec{Exclude: []string{"/note"}}, body{"application/x-www-form-urlencoded", "prompt=cat&note=x"}, body{"application/x-www-form-urlencoded", "prompt=cat"}},
		{"form charset ignored", Spec{}, body{"application/x-www-form-urlencoded; charset=utf-8", "a=1"}, body{"application/x-www-form-urlencoded", "a=1"}},
		{
			"multipart boundary and part order",
			Spec{},
			multipartBody(t, "b1", part{"prompt", "", "cat"}, part{"n", "", "2"}, part{"image", "ref.png", "\x89PNG1"}),
			multipartBody(t, "another-boundary", part{"image", "ref.png", "\x89PNG1"}, part{"n", "", "2"}, part{"prompt", "", "cat"}),
		},
		{
			"multipart excluded part",
			Spec{Fields: []string{"/prompt", "/image"}, Exclude: []string{"/note"}},
			multipartBody(t, "b1", part{"prompt", "", "cat"}, part{"image", "a.png", "x"}, part{"note", "", "1"}),
			multipartBody(t, "b2", part{"image", "a.png", "x"}, part{"prompt", "", "cat"}),
		},
		{"no Content-Type", Spec{}, body{"", "hello"}, body{"", "hello"}},
		{"raw media type parameters normalized", Spec{}, body{"text/plain; Charset=\"UTF-8\"; format=flowed", "hello"}, body{"text/plain;format=flowed;charset=utf-8", "hello"}},
		{"JSON media type parameters ignored", Spec{}, body{"application/json; charset=utf-8", `{"a":1}`}, body{"application/json", `{"a":1}`}},
		{
			"multipart part headers normalized",
			Spec{},
			partsBody(t, "b1", rawPart{`form-data; name="image"; filename="a.png"`, "Image/PNG", "x"}),
			partsBody(t, "b2", rawPart{`Form-Data; filename="a.png"; name=image`, "image/png", "x"}),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if a, b := sumRequest(t, tt.spec, tt.a), sumRequest(t, tt.spec, tt.b); a != b {
				t.Errorf("%+v and %+v: different fingerprints %s and %s", tt.a, tt.b, a, b)
			}
		})
	}
}

func TestSumRequestDifferent(t *testing.T) {
	t.Parallel()
	form := "application/x-www-form-urlencoded"
	tests := []struct {
		name string
		spec Spec
		a, b body
	}{
		{"JSON and text", Spec{}, body{"application/json", `{"a":1}`}, body{"text/plain", `{"a":1}`}},
		{"JSON and another JSON type", Spec{}, body{"application/json", `{"a":1}`}, body{"application/merge-patch+json", `{"a":1}`}},
		{"text and no Content-Type", Spec{}, body{"text/plain", "x"}, body{"", "x"}},
		{"raw bytes differ", Spec{}, body{"application/octet-stream", "x"}, body{"application/octet-stream", "y"}},
		{"form value", Spec{}, body{form, "n=1"}, body{form, "n=2"}},
		{"form repeated values in order", Spec{}, body{form, "a=1&a=2"}, body{form, "a=2&a=1"}},
		{"form value holding a separator", Spec{}, body{form, "a=1%26b%3D2"}, body{form, "a=1&b=2"}},
		{"form name holding a separator", Spec{}, body{form, "a%3D1=2"}, body{form, "a=1%3D2"}},
		{"form absent and empty", Spec{Fields: []string{"/prompt"}}, body{form, "note=1"}, body{form, "prompt="}},
		{"form value moved", Spec{Fields: []string{"/a", "/b"}}, body{form, "a=1"}, body{form, "b=1"}},
		// Fields do not narrow a form: echo's form binder fills a nested
		// struct (JSON "/size/w", or "/size" whole) from the flat name "w".
		{"form field outside Fields", Spec{Fields: []string{"/prompt"}}, body{form, "prompt=cat&note=x"}, body{form, "note=y&prompt=cat"}},
		{"form field a deep pointer names", Spec{Fields: []string{"/prompt", "/size/w"}}, body{form, "prompt=x&w=1"}, body{form, "prompt=x&w=2"}},
		{"form field inside a selected object", Spec{Fields: []string{"/prompt", "/size"}}, body{form, "prompt=x&w=1"}, body{form, "prompt=x&w=2"}},
		{"form and JSON of the same field", Spec{Fields: []string{"/n"}}, body{form, "n=1"}, body{"application/json", `{"n":"1"}`}},
		{
			"multipart file bytes",
			Spec{},
			multipartBody(t, "b", part{"image", "ref.png", "\x89PNG1"}),
			multipartBody(t, "b", part{"image", "ref.png", "\x89PNG2"}),
		},
		{
			"multipart file and text of the same bytes",
			Spec{},
			multipartBody(t, "b", part{"image", "ref.png", "abc"}),
			multipartBody(t, "b", part{"image", "", "abc"}),
		},
		{
			"multipart order of parts of one name",
			Spec{},
			multipartBody(t, "b", part{"image", "1.png", "one"}, part{"image", "2.png", "two"}),
			multipartBody(t, "b", part{"image", "2.png", "two"}, part{"image", "1.png", "one"}),
		},
		{
			"multipart selected text",
			Spec{Fields: []string{"/prompt"}},
			multipartBody(t, "b", part{"prompt", "", "a cat"}),
			multipartBody(t, "b", part{"prompt", "", "a  cat"}),
		},
		{"multipart and form", Spec{}, multipartBody(t, "b", part{"a", "", "1"}), body{form, "a=1"}},
		{
			"multipart file name",
			Spec{},
			multipartBody(t, "b", part{"image", "a.png", "\x89PNG1"}),
			multipartBody(t, "b", part{"image", "b.png", "\x89PNG1"}),
		},
		{
			"multipart file name directory",
			Spec{Fields: []string{"/image"}},
			multipartBody(t, "b", part{"image", "a/x.png", "\x89PNG1"}),
			multipartBody(t, "b", part{"image", "b/x.png", "\x89PNG1"}),
		},
		{
			"multipart part Content-Type",
			Spec{Fields: []string{"/image"}},
			partsBody(t, "b", rawPart{`form-data; name="image"; filename="a.png"`, "image/png", "\x89PNG1"}),
			partsBody(t, "b", rawPart{`form-data; name="image"; filename="a.png"`, "image/jpeg", "\x89PNG1"}),
		},
		{
			"multipart part without and with a Content-Type",
			Spec{},
			partsBody(t, "b", rawPart{`form-data; name="image"; filename="a.png"`, "", "x"}),
			partsBody(t, "b", rawPart{`form-data; name="image"; filename="a.png"`, "application/octet-stream", "x"}),
		},
		{
			"multipart text part charset",
			Spec{Fields: []string{"/prompt"}},
			partsBody(t, "b", rawPart{`form-data; name="prompt"`, "text/plain; charset=utf-8", "caf\xc3\xa9"}),
			partsBody(t, "b", rawPart{`form-data; name="prompt"`, "text/plain; charset=iso-8859-1", "caf\xc3\xa9"}),
		},
		{"raw charset", Spec{}, body{"text/plain; charset=utf-8", "caf\xc3\xa9"}, body{"text/plain; charset=iso-8859-1", "caf\xc3\xa9"}},
		{"raw with and without charset", Spec{}, body{"text/plain", "hello"}, body{"text/plain; charset=utf-8", "hello"}},
		{"raw parameter value case", Spec{}, body{"text/plain; format=flowed", "hello"}, body{"text/plain; format=Flowed", "hello"}},
		{"raw parameters that do not parse", Spec{}, body{"text/plain; charset", "hello"}, body{"text/plain", "hello"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if a, b := sumRequest(t, tt.spec, tt.a), sumRequest(t, tt.spec, tt.b); a == b {
				t.Errorf("%+v and %+v share the fingerprint %s", tt.a, tt.b, a)
			}
		})
	}
}

func TestSumRequestInvalid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		spec Spec
		when body
	}{
		{"invalid JSON", Spec{}, body{"application/json", `{"a":}`}},
		{"invalid +json", Spec{}, body{"application/problem+json", `{"a":1,"a":2}`}},
		{"bad form escape", Spec{}, body{"application/x-www-form-urlencoded", "a=%zz"}},
		{"form with semicolons", Spec{}, body{"application/x-www-form-urlencoded", "a=1;b=2"}},
		{"multipart without a boundary", Spec{}, body{"multipart/form-data", "--x\r\n\r\n"}},
		{"truncated multipart", Spec{}, body{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1"}},
		{"malformed Content-Type", Spec{}, body{"application/", "x"}},
		{"malformed pointer", Spec{Fields: []string{"prompt"}}, body{"text/plain", "x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest("POST", "/", nil)
			r.Header.Set("Content-Type", tt.when.contentType)
			fp, err := tt.spec.SumRequest(r, []byte(tt.when.data))
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("SumRequest = %q, %v; want an error wrapping ErrInvalid", fp, err)
			}
		})
	}
}

// TestContentEncodingRaw: a body with a Content-Encoding is hashed as
// received with its coding, whatever its media type: the fingerprint
// cannot tell whether the handler reads it decoded, and parsing encoded
// bytes as a form let two gzip streams that decode to different forms
// share a fingerprint (middleware TestEncodedFormCollision).
func TestContentEncodingRaw(t *testing.T) {
	t.Parallel()
	const form = "application/x-www-form-urlencoded"
	sum := func(ct string, ce []string, body string) Fingerprint {
		t.Helper()
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("Content-Type", ct)
		r.Header["Content-Encoding"] = ce
		fp, err := Spec{Fields: []string{"/prompt"}}.SumRequest(r, []byte(body))
		if err != nil {
			t.Fatalf("%s %v %q: %v", ct, ce, body, err)
		}
		return fp
	}
	tests := []struct {
		name     string
		a, b     func() Fingerprint
		wantSame bool
	}{
		{"form escapes are no longer syntax", func() Fingerprint { return sum(form, []string{"gzip"}, "prompt=a%3Db") },
			func() Fingerprint { return sum(form, []string{"gzip"}, "prompt=a=b") }, false},
		{"fields outside the selection take part", func() Fingerprint { return sum("application/json", []string{"gzip"}, `{"prompt":"a","note":1}`) },
			func() Fingerprint { return sum("application/json", []string{"gzip"}, `{"prompt":"a","note":2}`) }, false},
		{"the coding takes part", func() Fingerprint { return sum(form, []string{"gzip"}, "x") },
			func() Fingerprint { return sum(form, []string{"deflate"}, "x") }, false},
		{"the coding as sent", func() Fingerprint { return sum(form, []string{"gzip"}, "x") },
			func() Fingerprint { return sum(form, []string{"GZIP"}, "x") }, false},
		{"with and without a coding", func() Fingerprint { return sum("text/plain", []string{"gzip"}, "x") },
			func() Fingerprint { return sum("text/plain", nil, "x") }, false},
		{"media type parameters take part", func() Fingerprint { return sum(form+"; charset=utf-8", []string{"gzip"}, "x") },
			func() Fingerprint { return sum(form, []string{"gzip"}, "x") }, false},
		{"lines are framed", func() Fingerprint { return sum(form, []string{"gzip", "br"}, "x") },
			func() Fingerprint { return sum(form, []string{"gzip, br"}, "x") }, false},
		{"the same bytes", func() Fingerprint { return sum(form, []string{"gzip"}, "\x1f\x8b;%") },
			func() Fingerprint { return sum(form, []string{"gzip"}, "\x1f\x8b;%") }, true},
		{"an empty body is the empty request", func() Fingerprint { return sum(form, []string{"gzip"}, "") },
			func() Fingerprint { return sum(form, nil, "") }, true},
	}
	for _, tt := range tests {
		if same := tt.a() == tt.b(); same != tt.wantSame {
			t.Errorf("%s: same = %v, want %v", tt.name, same, tt.wantSame)
		}
	}
}
