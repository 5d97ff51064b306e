package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// migration is one schema version: either SQL run in one transaction, or
// steps run outside any transaction (CREATE/DROP INDEX CONCURRENTLY),
// each of which must be safe to run again after a crash at any point.
type migration struct {
	version int
	name    string
	sql     string
	steps   []migrationStep
}

type migrationStep struct {
	name string
	run  func(ctx context.Context, m migrator) error
}

// migrations is the schema history, oldest first. Versions are never
// edited once released; a change is a new version.
var migrations = []migration{
	{version: 1, name: "create tasks with the narrow key (tenant, idempotency_key)", sql: sqlV1},
	{version: 2, name: "widen the key to (tenant, idempotency_key, runtime, network)", steps: []migrationStep{
		// An index left by a build that was killed is invalid: it enforces
		// nothing we can rely on, and IF NOT EXISTS would keep it for ever.
		{"drop an invalid leftover of the wide index", dropIfUnusable(indexKeyWide)},
		{"build the wide index concurrently", createIfAbsent(indexKeyWide, sqlCreateWideIndex)},
		// Only a valid, ready, unique index may replace the narrow one.
		{"read the wide index back", requireUsable(indexKeyWide, true, []string{"tenant", "idempotency_key", "runtime", "network"})},
		{"drop the narrow index concurrently", dropIndex(indexKeyNarrow)},
	}},
	{version: 3, name: "trace, lost-attempt policy, cancelled state, cancel notifications", sql: sqlV3},
	{version: 4, name: "validate v3's checks; index the claim by kind; index finished tasks for Prune", steps: []migrationStep{
		{"validate the state check", exec(sqlValidateStateCheck)},
		{"validate the lost-policy check", exec(sqlValidateLostCheck)},
		{"drop an invalid leftover of the claim index", dropIfUnusable(indexClaim)},
		{"build the claim index concurrently", createIfAbsent(indexClaim, sqlCreateClaimIndex)},
		{"read the claim index back", requireUsable(indexClaim, false, []string{"kind", "run_after"})},
		{"drop an invalid leftover of the finished-task index", dropIfUnusable(indexDone)},
		{"build the finished-task index concurrently", createIfAbsent(indexDone, sqlCreateDoneIndex)},
		{"read the finished-task index back", requireUsable(indexDone, false, []string{"finished_at"})},
		{"drop v1's finished-task index concurrently", dropIndex(indexFinishedV1)},
	}},
	{version: 5, name: "priority; claim indexes by priority", steps: []migrationStep{
		{"add the priority column", txExec(sqlAddPriority)},
		{"drop an invalid leftover of the claim index", dropIfUnusable(indexClaimV5)},
		{"build the claim index concurrently", createIfAbsent(indexClaimV5, sqlCreateClaimIndexV5)},
		{"read the claim index back", requireUsable(indexClaimV5, false, []string{"kind", "priority", "run_after"})},
		{"drop an invalid leftover of the runnable index", dropIfUnusable(indexRunnableV5)},
		{"build the runnable index concurrently", createIfAbsent(indexRunnableV5, sqlCreateRunnableIndexV5)},
		{"read the runnable index back", requireUsable(indexRunnableV5, false, []string{"priority", "run_after"})},
		{"drop v4's claim index concurrently", dropIndex(indexClaim)},
		{"drop v1's runnable index concurrently", dropIndex(indexRunnableV1)},
	}},
}

// Migrate brings the schema to the newest version. It is idempotent and
// safe to call from many nodes at once: one migrates while the others
// wait, polling an advisory lock (a session blocked in pg_advisory_lock
// would hold a snapshot that CREATE INDEX CONCURRENTLY waits for: a
// deadlock). Killed at any point, it leaves the table with a valid unique
// index on the key, and a rerun finishes the job.
//
// Migrate uses a connection of its own and closes it afterwards. The lock
// wait is bounded by ctx, each statement by statement_timeout (15min).
// Transactional steps also give up after waiting 5s for a table lock
// (lock_timeout); the CONCURRENTLY steps, which block no one while they
// wait, wait as long as the oldest running transaction.
func (s *Store) Migrate(ctx context.Context) error {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("pgstore: migrate: connect: %w", err)
	}
	// Session settings and the lock die with the connection: it never goes
	// back to the pool.
	conn := pc.Hijack()
	defer conn.Close(context.WithoutCancel(ctx))

	if _, err := conn.Exec(ctx, sqlMigrationTimeouts); err != nil {
		return fmt.Errorf("pgstore: migrate: set timeouts: %w", err)
	}
	schema, err := pinSearchPath(ctx, conn)
	if err != nil {
		return err
	}
	if err := lockMigrations(ctx, conn); err != nil {
		return err
	}
	if err := s.migrate(ctx, migrator{conn: conn, schema: schema}); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, sqlMigrationUnlock); err != nil {
		return fmt.Errorf("pgstore: migrate: unlock: %w", err)
	}
	return nil
}

// pinSearchPath sets the session's search_path to the schema it will
// migrate (the pool's current schema) and returns its name. Every name
// a migration leaves unqualified then resolves there and nowhere else,
// and the steps that drop something qualify it by this schema as well.
func pinSearchPath(ctx context.Context, conn *pgx.Conn) (string, error) {
	var schema, path *string
	if err := conn.QueryRow(ctx, sqlPinSearchPath).Scan(&schema, &path); err != nil {
		return "", fmt.Errorf("pgstore: migrate: pin search_path: %w", err)
	}
	if schema == nil {
		return "", errors.New("pgstore: migrate: search_path names no existing schema to migrate")
	}
	return *schema, nil
}

// migrator is the session a migration runs on and the schema it migrates.
type migrator struct {
	conn   *pgx.Conn
	schema string
}

// lockMigrations polls pg_try_advisory_lock with exponential backoff and
// jitter until it holds the lock or ctx ends. Between polls the session
// is idle and holds no snapshot.
func lockMigrations(ctx context.Context, conn *pgx.Conn) error {
	wait := 10 * time.Millisecond
	for {
		var ok bool
		if err := conn.QueryRow(ctx, sqlTryMigrationLock).Scan(&ok); err != nil {
			return fmt.Errorf("pgstore: migrate: lock: %w", err)
		}
		if ok {
			return nil
		}
		t := time.NewTimer(wait/2 + rand.N(wait/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("pgstore: migrate: waiting for another node's migration: %w", ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

func (s *Store) migrate(ctx context.Context, m migrator) error {
	s.hook(ctx, "locked", m.conn)
	if _, err := m.conn.Exec(ctx, sqlMigrationsTable); err != nil {
		return fmt.Errorf("pgstore: migrate: create version table: %w", err)
	}
	rows, _ := m.conn.Query(ctx, sqlAppliedVersions)
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return fmt.Errorf("pgstore: migrate: read versions: %w", err)
	}
	for _, v := range migrations {
		if slices.Contains(applied, v.version) || (s.test != nil && slices.Contains(s.test.migrateSkip, v.version)) {
			continue
		}
		if err := s.apply(ctx, m, v); err != nil {
			return fmt.Errorf("pgstore: migrate: v%d (%s): %w", v.version, v.name, err)
		}
	}
	s.hook(ctx, "done", m.conn)
	return nil
}

func (s *Store) apply(ctx context.Context, m migrator, v migration) error {
	if v.sql != "" {
		s.hook(ctx, fmt.Sprintf("v%d", v.version), m.conn)
		return pgx.BeginFunc(ctx, m.conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sqlTxLockTimeout); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, v.sql); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sqlRecordVersion, pgx.NamedArgs{"version": v.version, "name": v.name})
			return err
		})
	}
	for _, st := range v.steps {
		s.hook(ctx, fmt.Sprintf("v%d: %s", v.version, st.name), m.conn)
		if err := st.run(ctx, m); err != nil {
			return fmt.Errorf("%s: %w", st.name, err)
		}
	}
	s.hook(ctx, fmt.Sprintf("v%d: record", v.version), m.conn)
	_, err := m.conn.Exec(ctx, sqlRecordVersion, pgx.NamedArgs{"version": v.version, "name": v.name})
	return err
}

func (s *Store) hook(ctx context.Context, step string, conn *pgx.Conn) {
	if s.test != nil && s.test.migrateStep != nil {
		s.test.migrateStep(ctx, step, conn.PgConn().PID())
	}
}

// indexState is an index of the tasks table as the catalog has it.
type indexState struct {
	Usable   bool     `db:"usable"` // indisvalid AND indisready
	IsUnique bool     `db:"is_unique"`
	Columns  []string `db:"columns"`
}

// readIndex reads index name of the migrated schema's tasks table back;
// found is false when that table has no such index.
func readIndex(ctx context.Context, m migrator, name string) (indexState, bool, error) {
	rows, _ := m.conn.Query(ctx, sqlIndexState, pgx.NamedArgs{"index": name, "schema": m.schema})
	st, err := pgx.CollectOneRow(rows, pgx.RowToStructByName[indexState])
	if errors.Is(err, pgx.ErrNoRows) {
		return indexState{}, false, nil
	}
	return st, err == nil, err
}

// dropIndex drops index name if the migrated schema's tasks table has it,
// naming it by that schema: what it drops is checked first and qualified.
func dropIndex(name string) func(context.Context, migrator) error {
	return func(ctx context.Context, m migrator) error {
		_, found, err := readIndex(ctx, m, name)
		if err != nil || !found {
			return err
		}
		qualified := pgx.Identifier{m.schema, name}.Sanitize()
		_, err = m.conn.Exec(ctx, fmt.Sprintf(sqlDropIndex, qualified))
		return err
	}
}

// dropIfUnusable drops index name when a killed build left it invalid.
func dropIfUnusable(name string) func(context.Context, migrator) error {
	drop := dropIndex(name)
	return func(ctx context.Context, m migrator) error {
		st, found, err := readIndex(ctx, m, name)
		if err != nil || !found || st.Usable {
			return err
		}
		return drop(ctx, m)
	}
}

func createIfAbsent(name, create string) func(context.Context, migrator) error {
	return func(ctx context.Context, m migrator) error {
		_, found, err := readIndex(ctx, m, name)
		if err != nil || found {
			return err
		}
		_, err = m.conn.Exec(ctx, create)
		return err
	}
}

func requireUsable(name string, unique bool, columns []string) func(context.Context, migrator) error {
	return func(ctx context.Context, m migrator) error {
		st, found, err := readIndex(ctx, m, name)
		switch {
		case err != nil:
			return err
		case !found:
			return fmt.Errorf("index %s missing after its build", name)
		case !st.Usable || st.IsUnique != unique || !slices.Equal(st.Columns, columns):
			return fmt.Errorf("index %s is not a valid index (unique=%v) on %v after its build (valid&ready=%v, unique=%v, columns=%v)",
				name, unique, columns, st.Usable, st.IsUnique, st.Columns)
		}
		return nil
	}
}

func exec(sql string) func(context.Context, migrator) error {
	return func(ctx context.Context, m migrator) error {
		_, err := m.conn.Exec(ctx, sql)
		return err
	}
}
