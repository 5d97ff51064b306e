package keyspace

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// KindFor returns a kind for an HTTP method and route template, valid for
// Derive: "POST /v1/images" becomes "post-v1-images". When that readable
// mapping would lose information (lower-case or other characters in the
// method, a path that does not start with '/', characters outside
// [a-z0-9_/], "//", a trailing '/', more than 64 bytes) the first 8 hex
// digits of a SHA-256 of the method and route are appended, so routes that
// a router tells apart get different kinds: /v1/images and /v1/images/ do.
//
// Two routes could share a kind only through a 32-bit digest collision;
// even then the fingerprint, which covers the route, tells their requests
// apart, so a collision costs a false conflict, never a false replay.
func KindFor(method, route string) string {
	b := make([]byte, 0, maxKind)
	exact := method != "" && route != "" && route[0] == '/'
	dash := false
	put := func(c byte) {
		switch {
		case c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_':
			b = append(b, c)
			dash = false
		case c >= 'A' && c <= 'Z':
			b = append(b, c+'a'-'A')
			dash = false
		default:
			if !dash && len(b) > 0 {
				b = append(b, '-')
			}
			dash = true
		}
	}
	for i := 0; i < len(method); i++ {
		if c := method[i]; c < 'A' || c > 'Z' {
			exact = false
		}
		put(method[i])
	}
	put('/')
	for i := 0; i < len(route); i++ {
		c := route[i]
		// "//" and a trailing "/" vanish in the mapping: /v1/images/ and
		// /v1/images are different routes.
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '/') ||
			c == '/' && i > 0 && (route[i-1] == '/' || i == len(route)-1) {
			exact = false
		}
		put(c)
	}
	b = bytes.TrimRight(b, "-")
	if len(b) == 0 || b[0] == '_' {
		b = append([]byte("route"), b...)
		exact = false
	}
	if !exact || len(b) > maxKind {
		const suffix = 1 + 8 // "-" and 8 hex digits
		// Length-prefixed, so ("", " ") and (" ", "") hash apart.
		in := binary.AppendUvarint(make([]byte, 0, 2*binary.MaxVarintLen64+len(method)+len(route)), uint64(len(method)))
		in = append(in, method...)
		in = binary.AppendUvarint(in, uint64(len(route)))
		sum := sha256.Sum256(append(in, route...))
		if len(b) > maxKind-suffix {
			b = bytes.TrimRight(b[:maxKind-suffix], "-")
		}
		b = append(b, '-')
		b = hex.AppendEncode(b, sum[:4])
	}
	return string(b)
}
