package pgrecords_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/internal/migrate/migratetest"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/pgrecords"
)

func describe(t *testing.T, dsn string) string {
	t.Helper()
	conn, err := pgx.Connect(testCtx(t), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	s, err := migratetest.Describe(testCtx(t), conn, "idemgate_records_migrations")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestMigrationSQL: the script on an empty database builds Migrate's
// schema and versions; the status then has every version applied, and
// Migrate changes nothing.
func TestMigrationSQL(t *testing.T) {
	t.Parallel()
	byMigrate, byScript := testenv.PostgresDSN(t), testenv.PostgresDSN(t)
	newStore(t, newPool(t, byMigrate))
	want := describe(t, byMigrate)

	conn, err := pgx.Connect(testCtx(t), byScript)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := migratetest.Apply(testCtx(t), conn, pgrecords.MigrationSQL()); err != nil {
		t.Fatal(err)
	}
	if got := describe(t, byScript); got != want || !strings.Contains(got, "idemgate_records_migrations:1 ") {
		t.Fatalf("schema from the script:\n%s\nfrom Migrate:\n%s", got, want)
	}
	pool := newPool(t, byScript)
	s, err := pgrecords.New(testCtx(t), pool)
	if err != nil {
		t.Fatal(err)
	}
	vs, err := s.MigrationStatus(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		if !v.Applied || v.Unknown {
			t.Fatalf("status after the script: %+v", vs)
		}
	}
	if err := s.Migrate(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got := describe(t, byScript); got != want {
		t.Fatalf("Migrate after the script changed the schema:\n%s", got)
	}
}
