package pgrecords_test

import (
	"testing"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/pgrecords"
)

// TestMigrateFromScratchRunsNothingPlanted: a role with CREATE on public
// plants its shadowing operators and functions before the records table
// exists (the application adopts idemgate in a database where such a
// role already lives). The first Migrate, which applies every version
// from 1, as a superuser, runs none of them: a version's statements that
// run at migration time (DO blocks) name pg_catalog's functions.
func TestMigrateFromScratchRunsNothingPlanted(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	admin := newPool(t, dsn)
	ctx := testCtx(t)
	planter := planterConn(t, admin, dsn)
	if err := plant(ctx, planter, "public"); err != nil {
		t.Fatal(err)
	}
	if err := pgrecords.MigrateSkipping(ctx, admin); err != nil {
		t.Fatalf("migrate from scratch over planted objects: %v", err)
	}
}
