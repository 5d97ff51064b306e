package keyspace

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"testing/quick"
)

func TestNormalizeSegment(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		given string
		want  string
	}{
		{name: "empty", given: "", want: ""},
		{name: "plain tenant passes unchanged", given: "acme-01.prod_x", want: "acme-01.prod_x"},
		{name: "case is kept", given: "AcMe", want: "AcMe"},
		{name: "colon", given: "a:b", want: "a%3Ab"},
		{name: "percent is escaped too", given: "a%3Ab", want: "a%253Ab"},
		{name: "hash tag braces", given: "{t}", want: "%7Bt%7D"},
		{name: "whitespace", given: " a\tb\n", want: "%20a%09b%0A"},
		{name: "control bytes", given: "\x00\x1f\x7f", want: "%00%1F%7F"},
		{name: "utf-8 bytes one by one", given: "ü", want: "%C3%BC"},
		{name: "invalid utf-8", given: "\xff\xfe", want: "%FF%FE"},
		{name: "other punctuation", given: "a/b+c=d~e", want: "a%2Fb%2Bc%3Dd%7Ee"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := NormalizeSegment(tt.given); got != tt.want {
				t.Errorf("NormalizeSegment(%q) = %q, want %q", tt.given, got, tt.want)
			}
		})
	}
}

func TestNormalizeSegmentInjective(t *testing.T) {
	t.Parallel()
	roundTrip := func(s string) bool {
		n := NormalizeSegment(s)
		got, ok := unescape(n)
		return ok && got == s && checkSegment(n) == ""
	}
	if err := quick.Check(roundTrip, &quick.Config{MaxCount: 5000}); err != nil {
		t.Error(err)
	}
	distinct := func(a, b string) bool {
		return a == b || NormalizeSegment(a) != NormalizeSegment(b)
	}
	if err := quick.Check(distinct, &quick.Config{MaxCount: 5000}); err != nil {
		t.Error(err)
	}
}

func TestDerive(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		given      Scope
		when       string // kind
		wantString string
		wantTask   string
		wantTenant string
	}{
		{
			name:       "plain tenant",
			given:      Scope{Tenant: "acme-01.prod_x", User: "user-42", Request: "order-1001:generate"},
			when:       "image",
			wantString: "idem:acme-01.prod_x:image:6d894aa3ee802549d7f340e7c1cf0d1c1cb14cd84f768d92ffaa6785337c4997:42283e9901382ed79d4c9f550c7afd2957fdf95486da800e84a22d1c5a10d04b",
			wantTask:   "image:4de7f4a5e6720bd790e4fa05e74a0a167f4c3508195eb154c5c8b5e7982fd1df",
			wantTenant: "acme-01.prod_x",
		},
		{
			name:       "escaped tenant",
			given:      Scope{Tenant: "a:b ü", User: "u", Request: "r"},
			when:       "x",
			wantString: "idem:a%3Ab%20%C3%BC:x:0bfe935e70c321c7ca3afc75ce0d0ca2f98b5422e008bb31c00c6d7f1f1c0ad6:454349e422f05297191ead13e21d3db520e5abef52055e4964b82fb213f593a1",
			wantTask:   "x:b1c3b08e7b121e6b8460e9880f134d1edf64bfea283c21304835cb9a8c7345f4",
			wantTenant: "a%3Ab%20%C3%BC",
		},
		{
			name:       "limits",
			given:      Scope{Tenant: strings.Repeat("%", 255), User: strings.Repeat("\x00", 255), Request: strings.Repeat("~", 255)},
			when:       "a" + strings.Repeat("-", 63),
			wantTenant: strings.Repeat("%25", 255),
		},
		{
			name:       "request with space and punctuation",
			given:      Scope{Tenant: "t", User: "u", Request: ` settlement:"order 7"\close `},
			when:       "9_z",
			wantTenant: "t",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			k, err := Derive(tt.when, tt.given)
			if err != nil {
				t.Fatalf("Derive: %v", err)
			}
			if msg := checkKey(k, tt.when, tt.given); msg != "" {
				t.Error(msg)
			}
			if tt.wantString != "" && k.String() != tt.wantString {
				t.Errorf("String() = %q, want %q", k.String(), tt.wantString)
			}
			if tt.wantTask != "" && k.Task() != tt.wantTask {
				t.Errorf("Task() = %q, want %q", k.Task(), tt.wantTask)
			}
			if k.Tenant() != tt.wantTenant {
				t.Errorf("Tenant() = %q, want %q", k.Tenant(), tt.wantTenant)
			}
		})
	}
}

func TestDeriveInvalid(t *testing.T) {
	t.Parallel()
	ok := Scope{Tenant: "t", User: "u", Request: "r"}
	with := func(f func(*Scope)) Scope { s := ok; f(&s); return s }
	tests := []struct {
		name  string
		given Scope
		when  string // kind
		want  string // the whole error message
	}{
		{name: "empty kind", given: ok, when: "", want: "keyspace: kind is empty: invalid key input"},
		{name: "long kind", given: ok, when: strings.Repeat("k", 65), want: "keyspace: kind is 65 bytes, max 64: invalid key input"},
		{name: "upper-case kind", given: ok, when: "Image", want: `keyspace: kind "Image" has byte 'I' at offset 0, want [a-z0-9][a-z0-9_-]{0,63}: invalid key input`},
		{name: "kind starts with dash", given: ok, when: "-x", want: `keyspace: kind "-x" has byte '-' at offset 0, want [a-z0-9][a-z0-9_-]{0,63}: invalid key input`},
		{name: "kind starts with underscore", given: ok, when: "_x", want: `keyspace: kind "_x" has byte '_' at offset 0, want [a-z0-9][a-z0-9_-]{0,63}: invalid key input`},
		{name: "kind with colon", given: ok, when: "a:b", want: `keyspace: kind "a:b" has byte ':' at offset 1, want [a-z0-9][a-z0-9_-]{0,63}: invalid key input`},
		{name: "kind with dot", given: ok, when: "a.b", want: `keyspace: kind "a.b" has byte '.' at offset 1, want [a-z0-9][a-z0-9_-]{0,63}: invalid key input`},
		{name: "empty tenant", given: with(func(s *Scope) { s.Tenant = "" }), when: "k", want: "keyspace: tenant is empty: invalid key input"},
		{name: "long tenant", given: with(func(s *Scope) { s.Tenant = strings.Repeat("t", 256) }), when: "k", want: "keyspace: tenant is 256 bytes, max 255: invalid key input"},
		{name: "empty user", given: with(func(s *Scope) { s.User = "" }), when: "k", want: "keyspace: user is empty: invalid key input"},
		{name: "long user", given: with(func(s *Scope) { s.User = strings.Repeat("u", 256) }), when: "k", want: "keyspace: user is 256 bytes, max 255: invalid key input"},
		{name: "empty request", given: with(func(s *Scope) { s.Request = "" }), when: "k", want: "keyspace: request id is empty: invalid key input"},
		{name: "long request", given: with(func(s *Scope) { s.Request = strings.Repeat("r", 300) }), when: "k", want: "keyspace: request id is 300 bytes, max 255: invalid key input"},
		{name: "request with newline", given: with(func(s *Scope) { s.Request = "abc\n" }), when: "k", want: "keyspace: request id has byte 0x0A at offset 3, want printable ASCII 0x20-0x7E: invalid key input"},
		{name: "request with DEL", given: with(func(s *Scope) { s.Request = "\x7f" }), when: "k", want: "keyspace: request id has byte 0x7F at offset 0, want printable ASCII 0x20-0x7E: invalid key input"},
		{name: "request with utf-8", given: with(func(s *Scope) { s.Request = "é" }), when: "k", want: "keyspace: request id has byte 0xC3 at offset 0, want printable ASCII 0x20-0x7E: invalid key input"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			k, err := Derive(tt.when, tt.given)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Derive error = %v, want ErrInvalid", err)
			}
			if err.Error() != tt.want {
				t.Errorf("Derive error = %q, want %q", err, tt.want)
			}
			if k != (Key{}) {
				t.Errorf("Derive returned %q with an error, want the zero Key", k)
			}
		})
	}
}

func TestKeyZero(t *testing.T) {
	t.Parallel()
	var k Key
	for name, got := range map[string]string{
		"String": k.String(), "Task": k.Task(), "Tenant": k.Tenant(), "Kind": k.Kind(), "Owner": k.Owner(),
	} {
		if got != "" {
			t.Errorf("zero Key: %s() = %q, want empty", name, got)
		}
	}
}

func TestDeriveHidesUserAndRequest(t *testing.T) {
	t.Parallel()
	s := Scope{Tenant: "acme", User: "alice@example.com", Request: "order-77-close"}
	k, err := Derive("pay", s)
	if err != nil {
		t.Fatal(err)
	}
	for _, form := range []string{k.String(), k.Task()} {
		if strings.Contains(form, s.User) || strings.Contains(form, s.Request) {
			t.Errorf("key %q shows the user or request id in plaintext", form)
		}
	}
}

// TestDeriveDistinct derives keys for every combination of a set of
// look-alike inputs and checks that no two share String() or Task().
func TestDeriveDistinct(t *testing.T) {
	t.Parallel()
	values := []string{
		"a", "A", "b", "a:b", "a%3Ab", "a%3ab", "a%253Ab", "a b", "a%20b", "a ", " a",
		"a{b}", "%", "%25", "ü", "u\u0308", "\xc3", "\x00", "\xff", "idem", "a:b:c",
	}
	kinds := []string{"k", "k1", "k-1", "k_1", "a", "b"}
	strs := map[string]string{}
	tasks := map[string]string{}
	n := 0
	for _, kind := range kinds {
		for _, tenant := range values {
			for _, user := range values {
				for _, request := range values {
					s := Scope{Tenant: tenant, User: user, Request: request}
					k, err := Derive(kind, s)
					if err != nil {
						if !errors.Is(err, ErrInvalid) {
							t.Fatalf("Derive(%q, %+v) = %v, want ErrInvalid", kind, s, err)
						}
						continue
					}
					n++
					in := kind + "|" + tenant + "|" + user + "|" + request
					if prev, dup := strs[k.String()]; dup {
						t.Fatalf("inputs %q and %q share String() %q", prev, in, k)
					}
					if prev, dup := tasks[k.Task()]; dup {
						t.Fatalf("inputs %q and %q share Task() %q", prev, in, k.Task())
					}
					strs[k.String()], tasks[k.Task()] = in, in
				}
			}
		}
	}
	if n < 10000 {
		t.Fatalf("only %d valid combinations; the test set lost its coverage", n)
	}
}

func FuzzNormalizeSegment(f *testing.F) {
	for _, s := range [][2]string{
		{"a:b", "a%3Ab"}, {"A", "a"}, {"%", "%25"}, {"acme-01.prod_x", "acme-01.prod_x "},
		{"{t}", "%7Bt%7D"}, {"\x00", ""}, {"ü", "u\u0308"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		na, nb := NormalizeSegment(a), NormalizeSegment(b)
		if a != b && na == nb {
			t.Fatalf("NormalizeSegment(%q) = NormalizeSegment(%q) = %q", a, b, na)
		}
		for _, p := range [][2]string{{a, na}, {b, nb}} {
			if msg := checkSegment(p[1]); msg != "" {
				t.Fatalf("NormalizeSegment(%q) = %q: %s", p[0], p[1], msg)
			}
			if got, ok := unescape(p[1]); !ok || got != p[0] {
				t.Fatalf("NormalizeSegment(%q) = %q does not decode back", p[0], p[1])
			}
		}
	})
}

func FuzzDerive(f *testing.F) {
	f.Add("image", "acme", "user-42", "order-1001:generate")
	f.Add("x", "a:b", "u", "r")
	f.Add("", "", "", "")
	f.Add("Image", "t", "u", "r\n")
	f.Add("a-", "{t}", "\xff", "~")
	f.Fuzz(func(t *testing.T, kind, tenant, user, request string) {
		s := Scope{Tenant: tenant, User: user, Request: request}
		k, err := Derive(kind, s)
		if valid(kind, s) != (err == nil) {
			t.Fatalf("Derive(%q, %+v) error = %v, but the input valid = %v", kind, s, err, valid(kind, s))
		}
		if err != nil {
			if !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), "keyspace: ") {
				t.Fatalf("Derive error = %q, want a keyspace error wrapping ErrInvalid", err)
			}
			if k != (Key{}) {
				t.Fatalf("Derive returned %q with an error", k)
			}
			return
		}
		if msg := checkKey(k, kind, s); msg != "" {
			t.Fatal(msg)
		}
	})
}

func BenchmarkDerive(b *testing.B) {
	for _, bm := range []struct {
		name string
		s    Scope
	}{
		{"plain", Scope{Tenant: "acme-01", User: "user-42", Request: "order-1001:generate"}},
		{"escaped", Scope{Tenant: "Acme Corp: EU", User: "user-42", Request: "order-1001:generate"}},
	} {
		b.Run(bm.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Derive("image", bm.s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// valid is an independent statement of Derive's input rules.
func valid(kind string, s Scope) bool {
	if len(kind) < 1 || len(kind) > 64 {
		return false
	}
	for i, c := range []byte(kind) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || i > 0 && strings.IndexByte("_-", c) >= 0) {
			return false
		}
	}
	for _, v := range []string{s.Tenant, s.User, s.Request} {
		if len(v) < 1 || len(v) > 255 {
			return false
		}
	}
	for _, c := range []byte(s.Request) {
		if c < 0x20 || c > 0x7E {
			return false
		}
	}
	return true
}

// checkKey takes k apart and reports how it differs from the key for kind
// and s, or "" if it does not.
func checkKey(k Key, kind string, s Scope) string {
	sum := func(v string) string { h := sha256.Sum256([]byte(v)); return hex.EncodeToString(h[:]) }
	parts := strings.Split(k.String(), ":")
	want := []string{"idem", NormalizeSegment(s.Tenant), kind, sum(s.User), sum(s.Request)}
	switch {
	case len(parts) != len(want):
		return "String() " + k.String() + " does not have 5 ':'-separated parts"
	case strings.Join(parts, "\n") != strings.Join(want, "\n"):
		return "String() = " + k.String() + ", want " + strings.Join(want, ":")
	case k.Task() != kind+":"+sum(k.String()):
		return "Task() = " + k.Task() + ", want " + kind + ":" + sum(k.String())
	case k.Tenant() != want[1] || k.Kind() != kind || k.Owner() != want[3]:
		return "Tenant/Kind/Owner = " + k.Tenant() + " " + k.Kind() + " " + k.Owner() + ", want " + strings.Join(want[1:4], " ")
	case strings.ContainsAny(k.String(), "{} \t\r\n"):
		return "String() " + k.String() + " contains a hash tag brace or whitespace"
	}
	return ""
}

// checkSegment reports why n is not a well-formed normalized segment, or "".
func checkSegment(n string) string {
	const allowed = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-%"
	for _, c := range []byte(n) {
		if strings.IndexByte(allowed, c) < 0 {
			return "contains byte 0x" + hex.EncodeToString([]byte{c}) + " outside [A-Za-z0-9._%-]"
		}
	}
	return ""
}

// unescape inverts NormalizeSegment; ok is false if n is not an output of it
// (any other byte, a lower-case escape, or an escape of a plain byte).
// Every segment decoding back to its input is what makes the mapping injective.
func unescape(n string) (s string, ok bool) {
	var b []byte
	for i := 0; i < len(n); i++ {
		c := n[i]
		if c != '%' {
			if !plain(c) {
				return "", false
			}
			b = append(b, c)
			continue
		}
		if i+2 >= len(n) || strings.ToUpper(n[i+1:i+3]) != n[i+1:i+3] {
			return "", false
		}
		d, err := hex.DecodeString(n[i+1 : i+3])
		if err != nil || plain(d[0]) {
			return "", false
		}
		b = append(b, d[0])
		i += 2
	}
	return string(b), true
}

// TestTaskLongestKey: Task hashes the whole String of the longest key
// Derive makes (every tenant byte escaped, the longest kind), not a
// prefix that a fixed buffer holds, and a copy of the Key agrees.
func TestTaskLongestKey(t *testing.T) {
	kind := "a" + strings.Repeat("z", maxKind-1)
	s := Scope{Tenant: strings.Repeat("\xff", MaxTenant), User: strings.Repeat("u", MaxUser), Request: strings.Repeat("r", MaxRequest)}
	k, err := Derive(kind, s)
	if err != nil {
		t.Fatal(err)
	}
	if len(k.String()) != maxKeyLen {
		t.Fatalf("String is %d bytes, maxKeyLen %d", len(k.String()), maxKeyLen)
	}
	if msg := checkKey(k, kind, s); msg != "" {
		t.Fatal(msg)
	}
	if c := k; c.Task() != k.Task() {
		t.Fatal("a copy's Task differs")
	}
}
