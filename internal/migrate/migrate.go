// Package migrate runs versioned schema migrations on PostgreSQL: the
// runner that pgstore and pgrecords share. Each package declares its own
// versions, its own version table and its own advisory lock class; the
// runner brings the pool's current schema to the newest version.
//
// A run is idempotent and safe from many nodes at once: one migrates while
// the others wait, polling an advisory lock (a session blocked in
// pg_advisory_lock would hold a snapshot that CREATE INDEX CONCURRENTLY
// waits for: a deadlock). A version is either SQL run in one transaction
// together with the row that records it, or steps run outside any
// transaction, each safe to run again after a crash at any point, recorded
// once all of them ran. Killed at any point, a rerun finishes the job.
package migrate

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Migration is one schema version: either SQL, run in one transaction, or
// Steps, run outside any transaction (CREATE/DROP INDEX CONCURRENTLY), each
// of which must be safe to run again after a crash at any point.
// Versions are never edited once released; a change is a new version.
type Migration struct {
	Version int
	Name    string
	SQL     string
	Steps   []Step
}

// Step is one non-transactional step of a Migration.
type Step struct {
	Name string
	Run  func(ctx context.Context, s Session) error
}

// Session is the connection a migration runs on (search_path pinned to
// Schema) and the schema it migrates.
type Session struct {
	Conn   *pgx.Conn
	Schema string

	// script, when set, receives the step's SQL (Runner.Script) and
	// Conn is nil: the step writes what it would run instead of running it.
	script *script
}

// Runner migrates one package's schema.
type Runner struct {
	// Package prefixes errors ("pgstore", "pgrecords").
	Package string
	// VersionTable records the applied versions; one per package.
	VersionTable string
	// LockClass is the first key of the advisory lock (the second is the
	// schema's hashtext): one per package, so that two packages migrate
	// the same schema independently.
	LockClass int32
	// Migrations is the history, oldest first.
	Migrations []Migration

	// Hook, if set, runs before each step with the migrating session
	// ("locked", "v1", "v2: <step>", "v2: record", "done"); for tests.
	Hook func(ctx context.Context, step string, conn *pgx.Conn)
	// Skip lists versions not to apply; for tests that build an old schema.
	Skip []int
}

// Bounded waits. No statement runs unbounded. The CONCURRENTLY steps wait
// for every transaction older than them, holding only a SHARE UPDATE
// EXCLUSIVE lock that blocks no reads or writes: waiting costs nothing but
// time, so no lock_timeout for them (nor for the version table, which only
// the lock holder touches). Transactional versions give up after 5s
// waiting for a table lock, rather than queue the table's readers and
// writers behind them.
//
// Every transaction of the session is READ COMMITTED, whatever the
// database's default_transaction_isolation: a step that takes a table
// lock and then reads the table (pgstore's v9 fills a table from the
// tasks after its triggers hold them) must read after the lock is
// granted, and under REPEATABLE READ the transaction's snapshot is that
// of its first statement, taken before the wait.
const (
	sqlTimeouts      = `SET statement_timeout = '15min'; SET lock_timeout = 0; SET default_transaction_isolation = 'read committed'`
	sqlTxLockTimeout = `SET LOCAL lock_timeout = '5s'`
	sqlTryLock       = `SELECT pg_catalog.pg_try_advisory_lock($1::pg_catalog.int4, pg_catalog.hashtext(pg_catalog.current_schema()::pg_catalog.text))`
	sqlUnlock        = `SELECT pg_catalog.pg_advisory_unlock($1::pg_catalog.int4, pg_catalog.hashtext(pg_catalog.current_schema()::pg_catalog.text))`
	// sqlPinSearchPath makes the migrating session see the schema it
	// migrates and nothing else (pg_catalog is always searched), so no
	// unqualified name in a migration resolves in another schema; pg_temp
	// is named last, or Postgres would search it first for relations, and
	// a temporary table the pool's connection holds from earlier use would
	// take the migration's statements. It
	// returns that schema; NULL when search_path names none that exists.
	// It runs on the pool's search_path, which may list a schema that
	// others can create in (public) before pg_catalog: every function and
	// operator is named by its schema, with arguments of the types it
	// takes, so that nothing planted there runs with the migrating role's
	// rights.
	sqlPinSearchPath = `SELECT pg_catalog.current_schema() AS schema,
	pg_catalog.set_config('search_path', pg_catalog.quote_ident(pg_catalog.current_schema()::pg_catalog.text) OPERATOR(pg_catalog.||) ', pg_temp', false) AS path`
	// %s is the version table's quoted name.
	sqlVersionTable = `CREATE TABLE IF NOT EXISTS %s (
	version    integer     PRIMARY KEY,
	name       text        NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`
	sqlAppliedVersions = `SELECT version FROM %s ORDER BY version`
	sqlRecordVersion   = `INSERT INTO %s (version, name) VALUES ($1, $2) ON CONFLICT (version) DO NOTHING`
)

// Run brings the pool's current schema to the newest version.
//
// Run uses a connection of its own and closes it afterwards (session
// settings and the lock die with it). The lock wait is bounded by ctx,
// each statement by statement_timeout (15min).
func (r *Runner) Run(ctx context.Context, pool *pgxpool.Pool) error {
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return r.errorf("connect: %w", err)
	}
	conn := pc.Hijack()
	defer conn.Close(context.WithoutCancel(ctx))

	if _, err := conn.Exec(ctx, sqlTimeouts); err != nil {
		return r.errorf("set timeouts: %w", err)
	}
	var schema, path *string
	if err := conn.QueryRow(ctx, sqlPinSearchPath).Scan(&schema, &path); err != nil {
		return r.errorf("pin search_path: %w", err)
	}
	if schema == nil {
		return r.errorf("search_path names no existing schema to migrate")
	}
	if err := r.lock(ctx, conn); err != nil {
		return err
	}
	if err := r.migrate(ctx, Session{Conn: conn, Schema: *schema}); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, sqlUnlock, r.LockClass); err != nil {
		return r.errorf("unlock: %w", err)
	}
	return nil
}

func (r *Runner) errorf(format string, args ...any) error {
	return fmt.Errorf(r.Package+": migrate: "+format, args...)
}

// lock polls pg_try_advisory_lock with exponential backoff and jitter
// until it holds the lock or ctx ends. Between polls the session is idle
// and holds no snapshot.
func (r *Runner) lock(ctx context.Context, conn *pgx.Conn) error {
	wait := 10 * time.Millisecond
	for {
		var ok bool
		if err := conn.QueryRow(ctx, sqlTryLock, r.LockClass).Scan(&ok); err != nil {
			return r.errorf("lock: %w", err)
		}
		if ok {
			return nil
		}
		t := time.NewTimer(wait/2 + rand.N(wait/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return r.errorf("waiting for another node's migration: %w", ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

func (r *Runner) migrate(ctx context.Context, s Session) error {
	r.hook(ctx, "locked", s.Conn)
	table := pgx.Identifier{r.VersionTable}.Sanitize()
	if _, err := s.Conn.Exec(ctx, fmt.Sprintf(sqlVersionTable, table)); err != nil {
		return r.errorf("create version table: %w", err)
	}
	rows, _ := s.Conn.Query(ctx, fmt.Sprintf(sqlAppliedVersions, table))
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return r.errorf("read versions: %w", err)
	}
	for _, m := range r.Migrations {
		if slices.Contains(applied, m.Version) || slices.Contains(r.Skip, m.Version) {
			continue
		}
		if err := r.apply(ctx, s, table, m); err != nil {
			return r.errorf("v%d (%s): %w", m.Version, m.Name, err)
		}
	}
	r.hook(ctx, "done", s.Conn)
	return nil
}

func (r *Runner) apply(ctx context.Context, s Session, table string, m Migration) error {
	record := fmt.Sprintf(sqlRecordVersion, table)
	if m.SQL != "" {
		r.hook(ctx, fmt.Sprintf("v%d", m.Version), s.Conn)
		return pgx.BeginFunc(ctx, s.Conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sqlTxLockTimeout); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, record, m.Version, m.Name)
			return err
		})
	}
	for _, st := range m.Steps {
		r.hook(ctx, fmt.Sprintf("v%d: %s", m.Version, st.Name), s.Conn)
		if err := st.Run(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", st.Name, err)
		}
	}
	r.hook(ctx, fmt.Sprintf("v%d: record", m.Version), s.Conn)
	_, err := s.Conn.Exec(ctx, record, m.Version, m.Name)
	return err
}

func (r *Runner) hook(ctx context.Context, step string, conn *pgx.Conn) {
	if r.Hook != nil {
		r.Hook(ctx, step, conn)
	}
}

// IndexState is an index as the catalog has it.
type IndexState struct {
	Usable   bool     `db:"usable"` // indisvalid AND indisready
	IsUnique bool     `db:"is_unique"`
	Columns  []string `db:"columns"`
}

// sqlIndexState reads index @index of table @table in schema @schema back
// from the catalog. No row: the index does not exist.
const sqlIndexState = `SELECT i.indisvalid AND i.indisready AS usable, i.indisunique AS is_unique,
	pg_catalog.array_agg(a.attname::pg_catalog.text ORDER BY k.ord) AS columns
FROM pg_catalog.pg_index i
JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
CROSS JOIN LATERAL pg_catalog.unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = pg_catalog.to_regclass(pg_catalog.format('%I.%I', @schema::pg_catalog.text, @table::pg_catalog.text)) AND c.relname = @index
	AND c.relnamespace = (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = @schema)
GROUP BY i.indisvalid, i.indisready, i.indisunique`

// ReadIndex reads index name of the migrated schema's table back; found
// is false when that table has no such index.
func ReadIndex(ctx context.Context, s Session, table, name string) (IndexState, bool, error) {
	rows, _ := s.Conn.Query(ctx, sqlIndexState, pgx.NamedArgs{"index": name, "table": table, "schema": s.Schema})
	st, err := pgx.CollectOneRow(rows, pgx.RowToStructByName[IndexState])
	if errors.Is(err, pgx.ErrNoRows) {
		return IndexState{}, false, nil
	}
	return st, err == nil, err
}

// DropIndex drops index name if the migrated schema's table has it, naming
// it by that schema: what it drops is checked first and qualified.
func DropIndex(table, name string) func(context.Context, Session) error {
	return func(ctx context.Context, s Session) error {
		if s.script != nil {
			s.script.statement("DROP INDEX CONCURRENTLY IF EXISTS " + pgx.Identifier{name}.Sanitize())
			return nil
		}
		_, found, err := ReadIndex(ctx, s, table, name)
		if err != nil || !found {
			return err
		}
		_, err = s.Conn.Exec(ctx, "DROP INDEX CONCURRENTLY IF EXISTS "+pgx.Identifier{s.Schema, name}.Sanitize())
		return err
	}
}

// DropIfUnusable drops index name when a killed build left it invalid: it
// enforces nothing one can rely on, and IF NOT EXISTS would keep it for ever.
func DropIfUnusable(table, name string) func(context.Context, Session) error {
	drop := DropIndex(table, name)
	return func(ctx context.Context, s Session) error {
		if s.script != nil {
			s.script.refuseUnusable(table, name)
			return nil
		}
		st, found, err := ReadIndex(ctx, s, table, name)
		if err != nil || !found || st.Usable {
			return err
		}
		return drop(ctx, s)
	}
}

// CreateIfAbsent runs create (a CREATE INDEX CONCURRENTLY) unless the
// table has index name.
func CreateIfAbsent(table, name, create string) func(context.Context, Session) error {
	return func(ctx context.Context, s Session) error {
		if s.script != nil {
			return s.script.createIfAbsent(create)
		}
		_, found, err := ReadIndex(ctx, s, table, name)
		if err != nil || found {
			return err
		}
		_, err = s.Conn.Exec(ctx, create)
		return err
	}
}

// RequireUsable fails unless index name is valid, ready, unique as asked,
// and on exactly columns.
func RequireUsable(table, name string, unique bool, columns []string) func(context.Context, Session) error {
	return func(ctx context.Context, s Session) error {
		if s.script != nil {
			s.script.requireUsable(table, name, unique, columns)
			return nil
		}
		st, found, err := ReadIndex(ctx, s, table, name)
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

// Exec runs sql as a step.
func Exec(sql string) func(context.Context, Session) error {
	return func(ctx context.Context, s Session) error {
		if s.script != nil {
			s.script.statement(sql)
			return nil
		}
		_, err := s.Conn.Exec(ctx, sql)
		return err
	}
}

// TxExec runs sql as a step in a transaction of its own that gives up
// after waiting 5s for its table lock, so that a catalog-only ALTER TABLE
// does not queue the table's readers and writers behind a long
// transaction. sql must be safe to run again (IF NOT EXISTS).
func TxExec(sql string) func(context.Context, Session) error {
	return func(ctx context.Context, s Session) error {
		if s.script != nil {
			s.script.transaction(sql)
			return nil
		}
		return pgx.BeginFunc(ctx, s.Conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sqlTxLockTimeout); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sql)
			return err
		})
	}
}
