package pgstore

import (
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Migrate builds the schema's tables and indexes in the schema, never on
// a temporary table of the same name that the pool's connection holds
// from earlier use (Postgres searches a session's temporary schema first
// for relations unless search_path names it): Migrate pins search_path to
// the schema, then pg_temp. Pinned to the schema alone, the first
// migration's statements after its CREATE TABLE read and altered the
// temporary table.
func TestMigrateIgnoresTemporaryTablesOfThePoolsConnection(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx := hangBound(t)
	cfg, err := pgxpool.ParseConfig(db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // Migrate gets the connection that holds the temporary tables
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TEMP TABLE idemgate_tasks (id uuid, tenant text, idempotency_key text,
		runtime text, network text, kind text, priority smallint, state text, turn bigint, run_after timestamptz);
		CREATE TEMP TABLE idemgate_waiting_tenants (kind text, priority smallint, tenant text)`); err != nil {
		t.Fatal(err)
	}
	s := newStore(pool)
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate on a connection with temporary tables of the schema's names: %v", err)
	}
	s2 := newStore(db.pool(t))
	mustSubmit(t, s2, tenantTask("a", "k1"))
	var indexes []string
	rows, err := s2.pool.Query(ctx, `SELECT indexname FROM pg_indexes WHERE schemaname = 'public' AND tablename = 'idemgate_tasks' ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		indexes = append(indexes, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(indexes, indexKeyDigest) {
		t.Fatalf("the schema's tasks table has indexes %v; want %s among them", indexes, indexKeyDigest)
	}
	if got := waitingLines(t, s2); !slices.Equal(got, []string{"image/0/a"}) {
		t.Fatalf("waiting lines %v", got)
	}
}
