package pgrecords

import "github.com/idemgate/idemgate/middleware"

// SQLClaim is the claim statement, for tests that look at what it returns.
const SQLClaim = sqlClaim

// Ident is the ident a claim by req sends.
func Ident(req middleware.ClaimRequest) []byte {
	return appendIdent(nil, req.Owner, req.Kind, string(req.Fingerprint))
}
