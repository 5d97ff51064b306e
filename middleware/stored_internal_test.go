package middleware

import (
	"encoding/binary"

	"github.com/idemgate/idemgate/internal/wire"
)

// The stored-response encodings that replayStored's tests feed it, as the
// Redis store (package redisstore) writes them.

// appendResponse appends the version 2 encoding of resp.
func appendResponse(b []byte, resp Response) ([]byte, error) {
	return wire.AppendResponse(b, resp.Status, resp.Header, resp.Body)
}

// decodeResponse decodes an encoded response of either version.
func decodeResponse(s string) (Response, error) {
	status, header, body, err := wire.Decode(s)
	return Response{Status: status, Header: header, Body: body}, err
}

// checkResponse checks the encoded response s of either version.
func checkResponse(s string) (storedResponse, error) { return wire.Check(s) }

// v1Response appends r as records version 1 stored it.
func v1Response(b []byte, r Response) []byte {
	b = append(b, wire.ResponseV1)
	b = binary.AppendUvarint(b, uint64(r.Status))
	b = binary.AppendUvarint(b, uint64(len(r.Header)))
	for name, values := range r.Header {
		b = wire.AppendString(b, name)
		b = binary.AppendUvarint(b, uint64(len(values)))
		for _, v := range values {
			b = wire.AppendString(b, v)
		}
	}
	return append(b, r.Body...)
}
