package middleware

import "crypto/rand"

// newToken returns a random fencing token, for the store tests of this
// package (the engine makes the claims' own, with their times).
func newToken() Token {
	var t Token
	_, _ = rand.Read(t[:])
	return t
}
