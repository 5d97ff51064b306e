package redisstore

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
)

// appendLowerHex accepts exactly lowercase hex of even length, and then
// decodes as hex.DecodeString does.
func TestAppendLowerHex(t *testing.T) {
	tests := []struct {
		in   string
		want []byte // nil: refused
	}{
		{"", []byte{}},
		{"00ff10", []byte{0x00, 0xff, 0x10}},
		{"0123456789abcdef", []byte{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef}},
		{"0A", nil},
		{"abc", nil},
		{"g0", nil},
		{"0:", nil},
		{"0/", nil},
		{"`a", nil},
	}
	for _, tt := range tests {
		got, ok := appendLowerHex([]byte("x"), tt.in)
		if ok != (tt.want != nil) || ok && !bytes.Equal(got, append([]byte("x"), tt.want...)) {
			t.Errorf("appendLowerHex(%q) = %x, %v; want %x, %v", tt.in, got, ok, tt.want, tt.want != nil)
		}
	}
}

func FuzzAppendLowerHex(f *testing.F) {
	for _, s := range []string{"", "00", "0A", "abc", "deadbeef", strings.Repeat("f", 64), "zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := appendLowerHex(nil, s)
		want, err := hex.DecodeString(s)
		lower := err == nil && s == strings.ToLower(s)
		if ok != lower {
			t.Fatalf("appendLowerHex(%q) ok = %v, want %v (hex error %v)", s, ok, lower, err)
		}
		if ok && !bytes.Equal(got, want) {
			t.Fatalf("appendLowerHex(%q) = %x, want %x", s, got, want)
		}
		if isLowerHex(s) != (len(s)%2 != 0 && isLowerHex(s[1:]) && isLowerHex(s[:1]) || ok) {
			t.Fatalf("isLowerHex(%q) = %v disagrees with appendLowerHex", s, isLowerHex(s))
		}
	})
}
