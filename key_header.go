package idemgate

import (
	"strings"

	"github.com/idemgate/idemgate/keyspace"
)

// maxKeyBytes bounds a request id (Stripe's limit): keyspace's, so that a
// value the parser accepts is never refused when the key is derived.
const maxKeyBytes = keyspace.MaxRequest

// parseKey parses one Idempotency-Key header value: an RFC 8941 sf-string
// ("…" with printable ASCII 0x20–0x7E inside and \" and \\ escapes), or a
// bare token of visible ASCII 0x21–0x7E not starting with '"'. It returns
// the request id and whether the value was valid; the id is never empty and
// at most 255 bytes. It allocates only for an sf-string with escapes.
func parseKey(v string) (string, bool) {
	if v == "" {
		return "", false
	}
	if v[0] != '"' {
		if len(v) > maxKeyBytes {
			return "", false
		}
		for i := 0; i < len(v); i++ {
			if v[i] < 0x21 || v[i] > 0x7e {
				return "", false
			}
		}
		return v, true
	}
	// sf-string: a closing quote must be the last byte.
	if len(v) < 3 || v[len(v)-1] != '"' || len(v) > 2*maxKeyBytes+2 {
		return "", false
	}
	inner := v[1 : len(v)-1]
	escapes := false
	for i := 0; i < len(inner); i++ {
		c := inner[i]
		switch {
		case c == '\\':
			if i+1 == len(inner) || (inner[i+1] != '"' && inner[i+1] != '\\') {
				return "", false
			}
			escapes = true
			i++
		case c == '"' || c < 0x20 || c > 0x7e:
			return "", false
		}
	}
	if escapes {
		var b strings.Builder
		b.Grow(len(inner))
		for i := 0; i < len(inner); i++ {
			if inner[i] == '\\' {
				i++
			}
			b.WriteByte(inner[i])
		}
		inner = b.String()
	}
	if len(inner) > maxKeyBytes {
		return "", false
	}
	return inner, true
}
