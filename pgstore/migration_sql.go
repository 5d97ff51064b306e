package pgstore

import (
	"context"

	"github.com/idemgate/idemgate/internal/migrate"
)

// MigrationVersion is one schema version as a database has it (see
// Store.MigrationStatus).
type MigrationVersion = migrate.VersionState

// MigrationSQL returns the SQL of pgstore's migrations, oldest first, for
// a DBA or a migration tool that runs DDL itself (psql -v ON_ERROR_STOP=1
// -f, goose, atlas, …) instead of Migrate at boot. It migrates the
// connection's current schema and records each version in the table
// Migrate reads, so that Migrate then finds nothing to do.
//
// Each version starts with a line "-- idemgate:begin pgstore v<N>
// transaction|no-transaction: <name>". A transaction version is one
// BEGIN … COMMIT. A no-transaction version builds or drops indexes
// CONCURRENTLY: its statements, each after a "-- idemgate:step" line, run
// on their own outside any transaction, in order (psql does so); a step
// that reads an index back raises an error unless the build left a valid
// index. A version already recorded refuses to run again.
func MigrationSQL() string {
	r := migrationRunner()
	sql, err := r.Script()
	if err != nil {
		// Every step is built with internal/migrate's helpers, which all
		// have an SQL form; TestMigrationSQL keeps it so.
		panic(err)
	}
	return sql
}

// MigrationStatus reports, for each version, whether the pool's current
// schema has it, oldest first; a version that a newer build applied comes
// last with Unknown set. It only reads: a schema that was never migrated
// has no version applied.
func (s *Store) MigrationStatus(ctx context.Context) ([]MigrationVersion, error) {
	r := migrationRunner()
	_, vs, err := r.Status(ctx, s.pool)
	return vs, err
}

// migrationRunner is the runner Migrate uses, without its test hooks.
func migrationRunner() migrate.Runner {
	return migrate.Runner{
		Package:      "pgstore",
		VersionTable: "idemgate_schema_migrations",
		LockClass:    8191,
		Migrations:   migrations,
	}
}
