package middleware

import "github.com/idemgate/idemgate/internal/wire"

// storedResponse is a finished response that the Redis store checked but
// did not decode (redisstore.Store.ClaimStored), for replayStored to write
// as it is.
type storedResponse = wire.Stored

// response decodes a stored response.
func response(sr *storedResponse) Response {
	status, header, body := sr.Decode()
	return Response{Status: status, Header: header, Body: body}
}
