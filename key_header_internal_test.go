package idemgate

import (
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		given  string
		want   string
		wantOK bool
	}{
		{"bare token", "req-1", "req-1", true},
		{"bare token of every visible byte", "!#$%&'()*+,-./0:;<=>?@AZ[\\]^_`az{|}~", "!#$%&'()*+,-./0:;<=>?@AZ[\\]^_`az{|}~", true},
		{"bare 255 bytes", strings.Repeat("a", 255), strings.Repeat("a", 255), true},
		{"bare 256 bytes", strings.Repeat("a", 256), "", false},
		{"empty", "", "", false},
		{"space inside bare", "a b", "", false},
		{"tab", "a\tb", "", false},
		{"DEL", "a\x7fb", "", false},
		{"NUL", "a\x00b", "", false},
		{"UTF-8", "clé", "", false},
		{"sf-string", `"req 1"`, "req 1", true},
		{"sf-string escapes", `"a\"b\\c"`, `a"b\c`, true},
		{"sf-string of 255 after unescaping", `"` + strings.Repeat(`\\`, 255) + `"`, strings.Repeat(`\`, 255), true},
		{"sf-string of 256", `"` + strings.Repeat("a", 256) + `"`, "", false},
		{"empty sf-string", `""`, "", false},
		{"lone quote", `"`, "", false},
		{"unterminated", `"abc`, "", false},
		{"trailing after close", `"abc"d`, "", false},
		{"inner quote", `"a"b"`, "", false},
		{"bad escape", `"a\nb"`, "", false},
		{"trailing backslash", `"abc\"`, "", false},
		{"control inside", "\"a\x01b\"", "", false},
		{"non-ASCII inside", `"clé"`, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := parseKey(tt.given)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("parseKey(%q) = %q, %v; want %q, %v", tt.given, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

// FuzzParseKey: whatever the header, an accepted id is 1–255 bytes of
// printable ASCII, and a bare token round-trips unchanged.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"req-1", `"a b"`, `"a\"b"`, `""`, `"`, "", strings.Repeat("x", 256), "a\x00", `"\\"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		id, ok := parseKey(v)
		if !ok {
			if id != "" {
				t.Fatalf("rejected %q but returned %q", v, id)
			}
			return
		}
		if len(id) == 0 || len(id) > maxKeyBytes {
			t.Fatalf("parseKey(%q) = %q: length %d", v, id, len(id))
		}
		for i := 0; i < len(id); i++ {
			if id[i] < 0x20 || id[i] > 0x7e {
				t.Fatalf("parseKey(%q) = %q: byte %#x", v, id, id[i])
			}
		}
		if v[0] != '"' && id != v {
			t.Fatalf("bare token %q changed to %q", v, id)
		}
		if v[0] == '"' {
			// Re-serializing the id as an sf-string gives the input back.
			re := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(id) + `"`
			if re != v {
				t.Fatalf("sf-string %q parsed to %q, which serializes to %q", v, id, re)
			}
		}
	})
}
