package fingerprint

import (
	"crypto/sha256"
	"encoding/binary"
)

// A Route is the request-target part of a fingerprint for one method and
// route template ("POST", "/v1/orders/:id/refund"). Build it once per route
// with NewRoute; it is a small comparable value, safe for concurrent use.
type Route struct {
	// frame is the start of the hash input: the version tag, the method
	// and the template, each length-prefixed.
	frame string
}

// routeVersion starts the hash input of a route fingerprint. It differs
// from the body version tag, so a route fingerprint and a body fingerprint
// never share a hash input.
const routeVersion = "idemgate route v1\x00"

// NewRoute returns the Route for an HTTP method and a route template, both
// compared byte for byte.
func NewRoute(method, template string) Route {
	b := make([]byte, 0, len(routeVersion)+2*binary.MaxVarintLen64+len(method)+len(template))
	b = append(b, routeVersion...)
	b = appendStr(b, method)
	b = appendStr(b, template)
	return Route{frame: string(b)}
}

// Sum binds a body fingerprint to the route, the path parameters (names
// and values, in order) and the raw query. The result is "v1:" and the hex
// SHA-256 of
//
//	"idemgate route v1" 0x00 str(method) str(template) str(body)
//	uvarint(len(names)) str(name)... uvarint(len(values)) str(value)... str(rawQuery)
//
// where str(x) is the uvarint length of x followed by x: every part is
// framed, so different inputs never share a hash input. The query is
// compared byte for byte: a reordered or re-escaped query is a (safe) false
// conflict, never a false replay. /v1/orders/1/refund and
// /v1/orders/2/refund, or one route with and without ?dry_run=true, never
// share a fingerprint. The zero Route is NewRoute("", "").
func (r Route) Sum(names, values []string, rawQuery string, body Fingerprint) Fingerprint {
	var buf [512]byte
	sum := sha256.Sum256(r.appendInput(buf[:0], names, values, rawQuery, body))
	return fingerprintOf(sum[:])
}

// appendInput appends the hash input of Sum to b.
func (r Route) appendInput(b []byte, names, values []string, rawQuery string, body Fingerprint) []byte {
	frame := r.frame
	if frame == "" {
		frame = NewRoute("", "").frame
	}
	b = append(b, frame...)
	b = appendStr(b, string(body))
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, n := range names {
		b = appendStr(b, n)
	}
	b = binary.AppendUvarint(b, uint64(len(values)))
	for _, v := range values {
		b = appendStr(b, v)
	}
	return appendStr(b, rawQuery)
}
