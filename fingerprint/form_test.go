package fingerprint

import (
	"crypto/sha256"
	"errors"
	"io"
	"mime/multipart"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"
)

// textValues returns the text values of f by name, as url.Values.
func textValues(f form) url.Values {
	v := url.Values{}
	for name, ff := range f {
		for _, fv := range ff.values {
			if !fv.file {
				v[name] = append(v[name], fv.text)
			}
		}
	}
	return v
}

// FuzzURLEncoded: the urlencoded parser accepts exactly what url.ParseQuery
// (and so net/http's ParseForm, and echo's binder) accepts, with the same
// values in the same order, and its errors quote nothing of the body.
func FuzzURLEncoded(f *testing.F) {
	for _, s := range []string{"", "a=1&b=2&a=3", "p=a+cat&q=a%20cat", "a=%zz", "a=1;b=2", "&&=&a", "%41=%42", "a==b", "a%", "a=%4", "%C5%BFize=1", "a=b=c&&"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		if strings.Count(body, "&") >= 1000 {
			return // url.ParseQuery caps the number of parameters
		}
		got, err := parseURLEncoded([]byte(body))
		want, werr := url.ParseQuery(body)
		if (err == nil) != (werr == nil) {
			t.Fatalf("%q: parseURLEncoded error %v, url.ParseQuery error %v", body, err, werr)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "offset ") {
				t.Fatalf("%q: error %v, want one wrapping ErrInvalid with an offset", body, err)
			}
			return
		}
		if len(want) == 0 {
			want = url.Values{}
		}
		if g := textValues(got); !reflect.DeepEqual(g, want) {
			t.Fatalf("%q: parsed %v, url.ParseQuery %v", body, g, want)
		}
		for name, ff := range got {
			if ff.off < 0 || ff.off >= len(body) {
				t.Fatalf("%q: field %q at offset %d", body, name, ff.off)
			}
		}
	})
}

// FuzzMultipart: a multipart body never panics the parser; a rejected one
// is an error wrapping ErrInvalid with an offset; an accepted one has the
// text values mime/multipart's ReadForm (behind ParseMultipartForm and
// echo's binder) reads, whenever ReadForm accepts it too.
func FuzzMultipart(f *testing.F) {
	f.Add("--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--b\r\nContent-Disposition: form-data; name=\"f\"; filename=\"x.png\"\r\nContent-Type: image/png\r\n\r\nPNG\r\n--b--\r\n")
	f.Add("--b\r\nContent-Disposition: form-data; name=\"a\"\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\na=3Db\r\n--b--\r\n")
	f.Add("--b\r\n4111111111111111\r\n\r\nx\r\n--b--\r\n")
	f.Add("preamble\r\n--b\r\nContent-Disposition: form-data; name=\"a\"; filename*=UTF-8''%C3%A9.png\r\n\r\n\r\n--b--")
	f.Add("--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1")
	f.Fuzz(func(t *testing.T, body string) {
		got, err := parseMultipart([]byte(body), "b")
		if err != nil {
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "offset ") {
				t.Fatalf("error %v, want one wrapping ErrInvalid with an offset", err)
			}
			return
		}
		mf, rerr := multipart.NewReader(strings.NewReader(body), "b").ReadForm(1 << 20)
		if rerr != nil {
			return
		}
		defer mf.RemoveAll()
		want := url.Values(mf.Value)
		g := textValues(got)
		delete(g, "") // ReadForm skips parts without a name
		if len(want) == 0 {
			want = url.Values{}
		}
		if !reflect.DeepEqual(g, want) {
			t.Fatalf("text values %v, ReadForm %v", g, want)
		}
		for name, fhs := range mf.File {
			ff := got[name]
			files := 0
			if ff != nil {
				for _, v := range ff.values {
					if v.file {
						files++
					}
				}
			}
			if files != len(fhs) {
				t.Fatalf("field %q: %d files, ReadForm %d", name, files, len(fhs))
			}
		}
	})
}

// FuzzMediaType: respelling a Content-Type (parameter order, case of
// parameter names and of the charset value, spaces, quoting) never changes
// the fingerprint of a raw body, and changing a parameter value does.
func FuzzMediaType(f *testing.F) {
	f.Add("text/plain", "charset", "utf-8", "format", "flowed")
	f.Add("application/octet-stream", "name", "a b", "x", "")
	f.Fuzz(func(t *testing.T, typ, k1, v1, k2, v2 string) {
		ct := func(a, b [2]string, sep string) string {
			return typ + sep + a[0] + "=\"" + a[1] + "\"" + sep + b[0] + "=\"" + b[1] + "\""
		}
		p1, p2 := [2]string{k1, v1}, [2]string{k2, v2}
		base := ct(p1, p2, "; ")
		mt, err := parseMediaType(base)
		if err != nil || mt.bad || len(mt.params) != 2 || isJSON(mt.typ) || strings.Contains(mt.typ, "form") {
			return // only well-formed raw media types with two parameters
		}
		sum := func(ct string) Fingerprint {
			r := httptest.NewRequest("POST", "/", nil)
			r.Header.Set("Content-Type", ct)
			fp, err := Spec{}.SumRequest(r, []byte("x"))
			if err != nil {
				t.Fatalf("%q: %v", ct, err)
			}
			return fp
		}
		want := sum(base)
		up := func(p [2]string) [2]string {
			p[0] = strings.ToUpper(p[0])
			if strings.EqualFold(p[0], "charset") {
				p[1] = strings.ToUpper(p[1])
			}
			return p
		}
		for _, v := range []string{ct(p2, p1, ";"), ct(up(p1), up(p2), " ; "), strings.ToUpper(typ) + strings.TrimPrefix(base, typ)} {
			if m, err := parseMediaType(v); err != nil || m.bad || len(m.params) != 2 {
				continue // the respelling changed what parses (e.g. names that collide)
			}
			if got := sum(v); got != want {
				t.Fatalf("%q and %q differ", base, v)
			}
		}
		if !strings.EqualFold(k1, "charset") {
			if other := ct([2]string{k1, v1 + "x"}, p2, "; "); sum(other) == want {
				t.Fatalf("%q and %q share a fingerprint", base, other)
			}
		}
	})
}

// TestURLEncodedOffsets: errors and fold errors of a urlencoded body name
// the offset of the fault.
func TestURLEncodedOffsets(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ body, want string }{
		{"a=1&b=%zz", "offset 6"},
		{"a=1&%z=1", "offset 4"},
		{"a=1&b=2;c", "offset 7"},
		{"abc=1&b=%", "offset 8"},
	} {
		_, err := parseURLEncoded([]byte(tt.body))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: %v, want an error at %s", tt.body, err, tt.want)
		}
	}
}

// TestMultipartValuesAsReadForm: quoted-printable parts, file names with
// RFC 2231 encoding and parts without a name read as ReadForm reads them.
func TestMultipartValuesAsReadForm(t *testing.T) {
	t.Parallel()
	body := "--b\r\nContent-Disposition: form-data; name=\"a\"\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\nx=3Dy\r\n" +
		"--b\r\nContent-Disposition: form-data; name=\"f\"; filename*=UTF-8''%C3%A9.png\r\n\r\nPNG\r\n--b--\r\n"
	f, err := parseMultipart([]byte(body), "b")
	if err != nil {
		t.Fatal(err)
	}
	mf, err := multipart.NewReader(strings.NewReader(body), "b").ReadForm(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if got := textValues(f); !reflect.DeepEqual(got, url.Values(mf.Value)) {
		t.Errorf("text values %v, ReadForm %v", got, mf.Value)
	}
	fh := mf.File["f"][0]
	r, _ := fh.Open()
	data, _ := io.ReadAll(r)
	if ff := f["f"]; ff == nil || len(ff.values) != 1 || !ff.values[0].file || ff.values[0].digest != sha256.Sum256(data) {
		t.Errorf("file part: %+v", ff)
	}
}
