package middleware

import (
	"strings"
	"testing"
)

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
