package idemgate

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

// The token layout is Token's (store.go).

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
