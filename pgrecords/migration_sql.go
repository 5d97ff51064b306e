package pgrecords

import (
	"context"

	"github.com/idemgate/idemgate/internal/migrate"
)

// MigrationVersion is one schema version as a database has it (see
// Store.MigrationStatus).
type MigrationVersion = migrate.VersionState

// MigrationSQL returns the SQL of pgrecords' migrations, oldest first, for
// a DBA or a migration tool that runs DDL itself instead of Migrate at
// boot. It migrates the connection's current schema and records each
// version in the table Migrate reads, so that Migrate then finds nothing
// to do. Each version starts with a line "-- idemgate:begin pgrecords
// v<N> transaction: <name>" and is one BEGIN … COMMIT; a version already
// recorded refuses to run again. See pgstore.MigrationSQL for the tasks'
// tables.
func MigrationSQL() string {
	r := migrationRunner()
	sql, err := r.Script()
	if err != nil {
		panic(err) // every version is SQL; TestMigrationSQL keeps it so
	}
	return sql
}

// MigrationStatus reports, for each version, whether the pool's current
// schema has it, oldest first; a version that a newer build applied comes
// last with Unknown set. It only reads.
func (s *Store) MigrationStatus(ctx context.Context) ([]MigrationVersion, error) {
	r := migrationRunner()
	_, vs, err := r.Status(ctx, s.pool)
	return vs, err
}

// migrationRunner is the runner Migrate uses.
func migrationRunner() migrate.Runner {
	return migrate.Runner{
		Package:      "pgrecords",
		VersionTable: "idemgate_records_migrations",
		LockClass:    8192,
		Migrations:   migrations,
	}
}
