package middleware

import (
	"crypto/rand"
	"encoding/binary"
	"math"
	"time"
)

// newToken returns a token from crypto/rand.
func newToken() Token {
	var t Token
	_, _ = rand.Read(t[:]) // crypto/rand.Read never fails (Go 1.24+).
	return t
}

// A claim's token records when the claim was made and for how long, so
// that an operator's tool can tell a claim whose handler still runs (its
// lease renewed every Lease/3) from one nobody renews, with no change to
// a store's record format: a node of an older idemgate carries such a
// token as the opaque bytes it always was. The layout is an RFC 9562
// version 8 UUID (pgrecords keeps the token as a uuid):
//
//	bytes 0–5    the claim's time, Unix milliseconds, big endian
//	byte 6       0x80 | 4 random bits (version 8)
//	byte 7       random
//	byte 8       0x80 | 6 random bits (variant 10)
//	bytes 9–12   the claim's lease in milliseconds, big endian (0: unknown,
//	             or longer than about 49 days)
//	bytes 13–15  random
//
// 42 random bits tell apart two claims of one key in one millisecond; a
// token only fences claims of the same key, one after another.
const (
	tokenVersion = 0x80
	tokenVariant = 0x80
)

// newClaimToken returns a fresh token for a claim made at now for lease.
func newClaimToken(now time.Time, lease time.Duration) Token {
	t := newToken()
	binary.BigEndian.PutUint64(t[:8], uint64(now.UnixMilli())<<16|uint64(binary.BigEndian.Uint16(t[6:8])))
	t[6] = tokenVersion | t[6]&0x0f
	t[8] = tokenVariant | t[8]&0x3f
	var ms uint32
	if l := lease.Milliseconds(); l > 0 && l <= math.MaxUint32 {
		ms = uint32(l)
	}
	binary.BigEndian.PutUint32(t[9:13], ms)
	return t
}
