package pgrecords

import (
	"context"

	"github.com/idemgate/idemgate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
)

// SQLClaim is the claim statement, for tests that look at what it returns.
const SQLClaim = sqlClaim

// Ident is the ident a claim by req sends.
func Ident(req idemgate.ClaimRequest) []byte {
	return appendIdent(nil, req.Owner, req.Kind, string(req.Fingerprint))
}

// MigrateSkipping migrates pool's current schema as Store.Migrate does,
// leaving out the versions skip: a database of an older build.
func MigrateSkipping(ctx context.Context, pool *pgxpool.Pool, skip ...int) error {
	r := migrationRunner()
	r.Skip = skip
	return r.Run(ctx, pool)
}

// Tx is the transaction of the echo request c on an Atomic route, or nil:
// TxFromContext of its context, for this package's echo handlers. (The
// exported Tx(echo.Context) went in v0.2.0, so that pgrecords links no
// echo.)
func Tx(c echo.Context) pgx.Tx {
	tx := TxFromContext(c.Request().Context())
	return tx
}
