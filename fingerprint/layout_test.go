package fingerprint

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestHashInputLayout rebuilds the v1 hash input by hand, as documented in
// fingerprint.go, so the documentation and the code cannot drift apart.
func TestHashInputLayout(t *testing.T) {
	t.Parallel()
	sum := func(parts ...string) Fingerprint {
		h := sha256.Sum256([]byte(strings.Join(parts, "")))
		return Fingerprint("v1:" + hex.EncodeToString(h[:]))
	}
	str := func(s string) string { return string([]byte{byte(len(s))}) + s } // every length here < 128
	const head = "idemgate fingerprint v1\x00"
	req := func(spec Spec, ct, body string) Fingerprint {
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("Content-Type", ct)
		fp, err := spec.SumRequest(r, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return fp
	}
	tests := []struct {
		name string
		got  Fingerprint
		want Fingerprint
	}{
		{
			"whole JSON body",
			mustSum(t, Spec{}, `{"b":[1.50,true,-0.02],"a":"x"}`),
			sum(head, str("application/json"), "J", `{"a":"x","b":[1.5e0,true,-2e-2]}`),
		},
		{
			"selected fields",
			mustSum(t, Spec{Fields: []string{"/b", "/a", "/z"}}, `{"b":[1.50,true],"a":"x"}`),
			sum(head, str("application/json"), "S", "\x03",
				str("/a"), "\x01", str("o"), str(`"x"`),
				str("/b"), "\x01", str("o"), str(`[1.5e0,true]`),
				str("/z"), "\x00"),
		},
		{
			"selected fields, typed paths",
			mustSum(t, Spec{Fields: []string{"", "/0", "/1/k/0", "/1/k"}}, `[7,{"k":["y"]}]`),
			sum(head, str("application/json"), "S", "\x04",
				str(""), "\x01", str(""), str(`[7e0,{"k":["y"]}]`),
				str("/0"), "\x01", str("a"), str(`7e0`),
				str("/1/k"), "\x01", str("ao"), str(`["y"]`),
				str("/1/k/0"), "\x01", str("aoa"), str(`"y"`)),
		},
		{
			"selected fields, object member named like an index",
			mustSum(t, Spec{Fields: []string{"/0"}}, `{"0":"x"}`),
			sum(head, str("application/json"), "S", "\x01",
				str("/0"), "\x01", str("o"), str(`"x"`)),
		},
		{
			"form",
			req(Spec{}, "application/x-www-form-urlencoded", "b=2&a=1&a=3"),
			sum(head, str("application/x-www-form-urlencoded"), "A", "\x02",
				str("a"), "\x02", "t", str(""), str("1"), "t", str(""), str("3"),
				str("b"), "\x01", "t", str(""), str("2")),
		},
		{
			"form with Fields: every field takes part, less the excluded",
			req(Spec{Fields: []string{"/b", "/c"}, Exclude: []string{"/d"}}, "application/x-www-form-urlencoded", "b=2&a=1&d=4"),
			sum(head, str("application/x-www-form-urlencoded"), "A", "\x02",
				str("a"), "\x01", "t", str(""), str("1"),
				str("b"), "\x01", "t", str(""), str("2")),
		},
		{
			"encoded body",
			func() Fingerprint {
				r := httptest.NewRequest("POST", "/", nil)
				r.Header.Set("Content-Type", "application/x-www-form-urlencoded; charset=UTF-8")
				r.Header["Content-Encoding"] = []string{"gzip", "br"}
				fp, err := Spec{Fields: []string{"/a"}}.SumRequest(r, []byte("a=1"))
				if err != nil {
					t.Fatal(err)
				}
				return fp
			}(),
			sum(head, str("application/x-www-form-urlencoded"), "C", "\x02", str("gzip"), str("br"),
				"p\x01", str("charset"), str("utf-8"), "a=1"),
		},
		{
			"multipart file",
			req(Spec{}, "multipart/form-data; boundary=X", "--X\r\nContent-Disposition: form-data; name=\"f\"; filename=\"a\"\r\nContent-Type: Image/PNG; Q=1; charset=UTF-8\r\nX-Note: As Sent\r\n\r\nabc\r\n--X--\r\n"),
			func() Fingerprint {
				d := sha256.Sum256([]byte("abc"))
				headers := "\x03" +
					str("Content-Disposition") + "\x01" + "m" + str("form-data") + "p\x02" + str("filename") + str("a") + str("name") + str("f") +
					str("Content-Type") + "\x01" + "m" + str("image/png") + "p\x02" + str("charset") + str("utf-8") + str("q") + str("1") +
					str("X-Note") + "\x01" + "r" + str("As Sent")
				return sum(head, str("multipart/form-data"), "A", "\x01", str("f"), "\x01", "f", str(headers), string(d[:]))
			}(),
		},
		{
			"multipart text",
			req(Spec{}, "multipart/form-data; boundary=X", "--X\r\nContent-Disposition: form-data; name=\"p\"\r\n\r\nabc\r\n--X--\r\n"),
			sum(head, str("multipart/form-data"), "A", "\x01", str("p"), "\x01", "t",
				str("\x01"+str("Content-Disposition")+"\x01"+"m"+str("form-data")+"p\x01"+str("name")+str("p")), str("abc")),
		},
		{
			"raw",
			req(Spec{}, "Text/Plain; Charset=UTF-8; Format=Flowed", "hi"),
			sum(head, str("text/plain"), "R", "p\x02", str("charset"), str("utf-8"), str("format"), str("Flowed"), "hi"),
		},
		{
			"raw, parameters that do not parse",
			req(Spec{}, "text/plain; charset", "hi"),
			sum(head, str("text/plain"), "R", "x", str("charset"), "hi"),
		},
		{
			"raw, no Content-Type",
			req(Spec{}, "", "hi"),
			sum(head, str(""), "R", "p\x00", "hi"),
		},
		{
			"empty JSON body",
			mustSum(t, Spec{Fields: []string{"/a"}}, ""),
			sum(head, str("application/json"), "E"),
		},
		{
			"empty form body",
			req(Spec{}, "application/x-www-form-urlencoded; charset=utf-8", ""),
			sum(head, str("application/x-www-form-urlencoded"), "E"),
		},
	}
	// A body large enough for Sum to hash it in chunks as it assembles it:
	// members in reverse order, values both smaller and larger than a chunk.
	var big strings.Builder
	big.WriteString(`{"z":{"y":1,"x":2}`)
	for i := 99; i >= 0; i-- {
		fmt.Fprintf(&big, `,"m%02d":{"b":%q,"a":[%d]}`, i, strings.Repeat("x", i*i*4), i)
	}
	big.WriteString(`}`)
	tests = append(tests, struct {
		name string
		got  Fingerprint
		want Fingerprint
	}{
		"large reordered body",
		mustSum(t, Spec{}, big.String()),
		sum(head, str("application/json"), "J", exactForm(t, big.String())),
	})
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, tt.got, tt.want)
		}
	}
}
