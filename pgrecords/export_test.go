package pgrecords

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/middleware"
)

// SQLClaim is the claim statement, for tests that look at what it returns.
const SQLClaim = sqlClaim

// Ident is the ident a claim by req sends.
func Ident(req middleware.ClaimRequest) []byte {
	return appendIdent(nil, req.Owner, req.Kind, string(req.Fingerprint))
}

// MigrateSkipping migrates pool's current schema as Store.Migrate does,
// leaving out the versions skip: a database of an older build.
func MigrateSkipping(ctx context.Context, pool *pgxpool.Pool, skip ...int) error {
	r := migrationRunner()
	r.Skip = skip
	return r.Run(ctx, pool)
}
