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
	run  func(ctx context.Context, conn *pgx.Conn) error
}

// migrations is the schema history, oldest first. Versions are never
// edited once released; a change is a new version.
var migrations = []migration{
	{version: 1, name: "create tasks with the narrow key (tenant, idempotency_key)", sql: sqlV1},
	{version: 2, name: "widen the key to (tenant, idempotency_key, runtime, network)", steps: []migrationStep{
		// An index left by a build that was killed is invalid: it enforces
		// nothing we can rely on, and IF NOT EXISTS would keep it for ever.
		{"drop an invalid leftover of the wide index", dropIfUnusable(indexKeyWide, sqlDropWideIndex)},
		{"build the wide index concurrently", createIfAbsent(indexKeyWide, sqlCreateWideIndex)},
		// Only a valid, ready, unique index may replace the narrow one.
		{"read the wide index back", requireUsable(indexKeyWide, []string{"tenant", "idempotency_key", "runtime", "network"})},
		{"drop the narrow index concurrently", exec(sqlDropNarrowIndex)},
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
	if err := lockMigrations(ctx, conn); err != nil {
		return err
	}
	if err := s.migrate(ctx, conn); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, sqlMigrationUnlock); err != nil {
		return fmt.Errorf("pgstore: migrate: unlock: %w", err)
	}
	return nil
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

func (s *Store) migrate(ctx context.Context, conn *pgx.Conn) error {
	s.hook(ctx, "locked", conn)
	if _, err := conn.Exec(ctx, sqlMigrationsTable); err != nil {
		return fmt.Errorf("pgstore: migrate: create version table: %w", err)
	}
	rows, _ := conn.Query(ctx, sqlAppliedVersions)
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return fmt.Errorf("pgstore: migrate: read versions: %w", err)
	}
	for _, m := range migrations {
		if slices.Contains(applied, m.version) || (s.test != nil && s.test.migrateTo > 0 && m.version > s.test.migrateTo) {
			continue
		}
		if err := s.apply(ctx, conn, m); err != nil {
			return fmt.Errorf("pgstore: migrate: v%d (%s): %w", m.version, m.name, err)
		}
	}
	s.hook(ctx, "done", conn)
	return nil
}

func (s *Store) apply(ctx context.Context, conn *pgx.Conn, m migration) error {
	if m.sql != "" {
		s.hook(ctx, fmt.Sprintf("v%d", m.version), conn)
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sqlTxLockTimeout); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sqlRecordVersion, m.version, m.name)
			return err
		})
	}
	for _, st := range m.steps {
		s.hook(ctx, fmt.Sprintf("v%d: %s", m.version, st.name), conn)
		if err := st.run(ctx, conn); err != nil {
			return fmt.Errorf("%s: %w", st.name, err)
		}
	}
	s.hook(ctx, fmt.Sprintf("v%d: record", m.version), conn)
	_, err := conn.Exec(ctx, sqlRecordVersion, m.version, m.name)
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

// readIndex reads index name back; found is false when it does not exist.
func readIndex(ctx context.Context, conn *pgx.Conn, name string) (indexState, bool, error) {
	rows, _ := conn.Query(ctx, sqlIndexState, name)
	st, err := pgx.CollectOneRow(rows, pgx.RowToStructByName[indexState])
	if errors.Is(err, pgx.ErrNoRows) {
		return indexState{}, false, nil
	}
	return st, err == nil, err
}

func dropIfUnusable(name, drop string) func(context.Context, *pgx.Conn) error {
	return func(ctx context.Context, conn *pgx.Conn) error {
		st, found, err := readIndex(ctx, conn, name)
		if err != nil || !found || st.Usable {
			return err
		}
		_, err = conn.Exec(ctx, drop)
		return err
	}
}

func createIfAbsent(name, create string) func(context.Context, *pgx.Conn) error {
	return func(ctx context.Context, conn *pgx.Conn) error {
		_, found, err := readIndex(ctx, conn, name)
		if err != nil || found {
			return err
		}
		_, err = conn.Exec(ctx, create)
		return err
	}
}

func requireUsable(name string, columns []string) func(context.Context, *pgx.Conn) error {
	return func(ctx context.Context, conn *pgx.Conn) error {
		st, found, err := readIndex(ctx, conn, name)
		switch {
		case err != nil:
			return err
		case !found:
			return fmt.Errorf("index %s missing after its build", name)
		case !st.Usable || !st.IsUnique || !slices.Equal(st.Columns, columns):
			return fmt.Errorf("index %s is not a valid unique index on %v after its build (valid&ready=%v, unique=%v, columns=%v)",
				name, columns, st.Usable, st.IsUnique, st.Columns)
		}
		return nil
	}
}

func exec(sql string) func(context.Context, *pgx.Conn) error {
	return func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, sql)
		return err
	}
}
