package idemgate

import (
	"strconv"
	"strings"
	"testing"
)

func TestAcceptsCoding(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		accept []string // Accept-Encoding values; nil: no header
		coding string
		want   bool
	}{
		{name: "no header accepts no coding", accept: nil, coding: "gzip", want: false},
		{name: "empty header accepts no coding", accept: []string{""}, coding: "gzip", want: false},
		{name: "listed", accept: []string{"gzip"}, coding: "gzip", want: true},
		{name: "listed in another case", accept: []string{"GZip"}, coding: "gzip", want: true},
		{name: "x-gzip is gzip", accept: []string{"x-gzip"}, coding: "gzip", want: true},
		{name: "gzip is x-gzip", accept: []string{"gzip"}, coding: "x-gzip", want: true},
		{name: "listed among others with OWS", accept: []string{"br ,\tdeflate , gzip ; q=0.8"}, coding: "gzip", want: true},
		{name: "second header line", accept: []string{"br", "gzip"}, coding: "gzip", want: true},
		{name: "q=0 refuses", accept: []string{"gzip;q=0"}, coding: "gzip", want: false},
		{name: "q=0.000 refuses", accept: []string{"gzip;q=0.000"}, coding: "gzip", want: false},
		{name: "q=0.001 accepts", accept: []string{"gzip;q=0.001"}, coding: "gzip", want: true},
		{name: "Q=1 accepts", accept: []string{"gzip;Q=1"}, coding: "gzip", want: true},
		{name: "listed twice, once with q=0, refuses", accept: []string{"gzip, gzip;q=0"}, coding: "gzip", want: false},
		{name: "wildcard", accept: []string{"*"}, coding: "br", want: true},
		{name: "wildcard with q=0", accept: []string{"*;q=0"}, coding: "br", want: false},
		{name: "listed q=0 beats wildcard", accept: []string{"*, br;q=0"}, coding: "br", want: false},
		{name: "listed beats wildcard q=0", accept: []string{"*;q=0, br"}, coding: "br", want: true},
		{name: "other coding only", accept: []string{"deflate"}, coding: "gzip", want: false},
		{name: "prefix is not the coding", accept: []string{"gzipx"}, coding: "gzip", want: false},
		{name: "malformed q is ignored", accept: []string{"gzip;q=2"}, coding: "gzip", want: false},
		{name: "malformed q on wildcard is ignored", accept: []string{"*;q=abc"}, coding: "gzip", want: false},
		{name: "other parameter is malformed", accept: []string{"gzip;level=9"}, coding: "gzip", want: false},
		{name: "too many q digits", accept: []string{"gzip;q=0.0001"}, coding: "gzip", want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := acceptsCoding(tt.accept, tt.coding); got != tt.want {
				t.Errorf("acceptsCoding(%q, %q) = %v, want %v", tt.accept, tt.coding, got, tt.want)
			}
		})
	}
}

func TestAcceptsEncoding(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		accept   []string
		encoding []string // stored Content-Encoding values
		want     bool
	}{
		{name: "every coding accepted", accept: []string{"gzip, br"}, encoding: []string{"br, gzip"}, want: true},
		{name: "one coding not accepted", accept: []string{"gzip"}, encoding: []string{"br, gzip"}, want: false},
		{name: "identity needs nothing", accept: nil, encoding: []string{"identity"}, want: true},
		{name: "second value checked", accept: []string{"gzip"}, encoding: []string{"gzip", "br"}, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := acceptsEncoding(tt.accept, tt.encoding); got != tt.want {
				t.Errorf("acceptsEncoding(%q, %q) = %v, want %v", tt.accept, tt.encoding, got, tt.want)
			}
		})
	}
}

// FuzzAcceptEncoding: the Accept-Encoding parser never panics; it accepts
// a coding only when the header names it (or an alias) or has "*"; adding
// "coding;q=0" always refuses it; a qvalue it takes agrees with
// strconv.ParseFloat.
func FuzzAcceptEncoding(f *testing.F) {
	for _, s := range []string{"gzip", "gzip;q=0", "*;q=0.5, br", "x-gzip, deflate;Q=1.000", " , ;q=", "gzip;q=0.0001", "*"} {
		f.Add(s, "gzip")
	}
	f.Fuzz(func(t *testing.T, accept, coding string) {
		got := acceptsCoding([]string{accept}, coding)
		if !isToken(coding) {
			return
		}
		lower := strings.ToLower(accept)
		c := canonicalCoding(coding)
		if got && !strings.Contains(lower, c) && !strings.Contains(lower, "*") &&
			!(c == "gzip" && strings.Contains(lower, "x-gzip")) && !(c == "compress" && strings.Contains(lower, "x-compress")) {
			t.Errorf("acceptsCoding(%q, %q) = true, but the header names neither it nor *", accept, coding)
		}
		if acceptsCoding([]string{accept + ", " + coding + ";q=0"}, coding) {
			t.Errorf("acceptsCoding(%q + \", %s;q=0\") = true", accept, coding)
		}
		_, q, _ := strings.Cut(accept, "q=")
		if positive, ok := parseQValue(q); ok {
			v, err := strconv.ParseFloat(q, 64)
			if err != nil || v < 0 || v > 1 || (v > 0) != positive {
				t.Errorf("parseQValue(%q) = %v, ok; ParseFloat = %v, %v", q, positive, v, err)
			}
		}
	})
}

func TestWithoutEncoding(t *testing.T) {
	t.Parallel()
	stored := map[string][]string{
		"Content-Encoding": {"gzip"},
		"Etag":             {`"v1-gz"`},
		"Vary":             {"Accept-Encoding"},
	}
	got := withoutEncoding(stored, 0)
	if _, ok := got["Content-Encoding"]; ok {
		t.Errorf("Content-Encoding kept: %v", got)
	}
	if e := got.Get("Etag"); e != `W/"v1-gz"` {
		t.Errorf("ETag = %q, want the strong tag made weak", e)
	}
	if v := got.Get("Vary"); v != "Accept-Encoding" {
		t.Errorf("Vary = %q", v)
	}
	if stored["Content-Encoding"] == nil || stored["Etag"][0] != `"v1-gz"` {
		t.Errorf("the stored header was changed: %v", stored)
	}
	if e := withoutEncoding(map[string][]string{"Etag": {`W/"x"`}}, 0).Get("Etag"); e != `W/"x"` {
		t.Errorf("weak ETag = %q, want it unchanged", e)
	}
}

func TestVaries(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		vary []string
		want bool
	}{
		{"none", nil, false},
		{"listed", []string{"Accept-Encoding"}, true},
		{"another case, with OWS", []string{"Origin ,\taccept-encoding "}, true},
		{"second line", []string{"Origin", "Accept-Encoding"}, true},
		{"wildcard", []string{"*"}, true},
		{"a prefix is not the field", []string{"Accept-Encoding-X, Accept"}, false},
		{"empty elements", []string{" , ,"}, false},
	} {
		if got := varies(tt.vary, "Accept-Encoding"); got != tt.want {
			t.Errorf("%s: varies(%q) = %v, want %v", tt.name, tt.vary, got, tt.want)
		}
	}
}

// FuzzVaries: varies finds a field listed anywhere among other elements,
// and withoutEncoding always leaves Accept-Encoding in Vary without
// touching the stored values.
func FuzzVaries(f *testing.F) {
	for _, s := range []string{"", "Origin", "*", "accept-encoding", " , ;", "Accept-Encoding, Origin"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		if !varies([]string{v + ",Accept-Encoding"}, "Accept-Encoding") {
			t.Fatalf("varies misses the field after %q", v)
		}
		stored := map[string][]string{"Vary": {v}, "Content-Encoding": {"gzip"}}
		got := withoutEncoding(stored, 0)
		if !varies(got["Vary"], "Accept-Encoding") {
			t.Fatalf("Vary %q after decoding lacks Accept-Encoding", got["Vary"])
		}
		if len(stored["Vary"]) != 1 || stored["Vary"][0] != v {
			t.Fatalf("stored Vary changed to %q", stored["Vary"])
		}
		if strings.Count(strings.Join(got["Vary"], ","), "Accept-Encoding") > 1+strings.Count(v, "Accept-Encoding") {
			t.Fatalf("Accept-Encoding added though listed: %q", got["Vary"])
		}
	})
}
