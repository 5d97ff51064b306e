package middleware

import (
	"context"

	"github.com/idemgate/idemgate/internal/wire"
	"github.com/idemgate/idemgate/redisstore"
)

// storedResponse is a finished response that the Redis store checked but
// did not decode, for replayStored to write as it is.
type storedResponse = wire.Stored

// storedClaimer is a store whose Claim can leave a finished response
// encoded (redisstore.Store.ClaimStored): a replay then writes the stored
// bytes without decoding them first.
type storedClaimer interface {
	ClaimStored(ctx context.Context, key string, req ClaimRequest) (ClaimResult, storedResponse, error)
}

var _ storedClaimer = (*redisstore.Store)(nil)

// response decodes a stored response.
func response(sr *storedResponse) Response {
	status, header, body := sr.Decode()
	return Response{Status: status, Header: header, Body: body}
}
