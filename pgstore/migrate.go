package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/internal/migrate"
)

// migrations is the schema history, oldest first. Versions are never
// edited once released; a change is a new version.
var migrations = []migrate.Migration{
	{Version: 1, Name: "create tasks with the narrow key (tenant, idempotency_key)", SQL: sqlV1},
	{Version: 2, Name: "widen the key to (tenant, idempotency_key, runtime, network)", Steps: []migrate.Step{
		// An index left by a build that was killed is invalid: it enforces
		// nothing we can rely on, and IF NOT EXISTS would keep it for ever.
		{Name: "drop an invalid leftover of the wide index", Run: migrate.DropIfUnusable(tasksTable, indexKeyWide)},
		{Name: "build the wide index concurrently", Run: migrate.CreateIfAbsent(tasksTable, indexKeyWide, sqlCreateWideIndex)},
		// Only a valid, ready, unique index may replace the narrow one.
		{Name: "read the wide index back", Run: migrate.RequireUsable(tasksTable, indexKeyWide, true, []string{"tenant", "idempotency_key", "runtime", "network"})},
		{Name: "drop the narrow index concurrently", Run: migrate.DropIndex(tasksTable, indexKeyNarrow)},
	}},
	{Version: 3, Name: "trace, lost-attempt policy, cancelled state, cancel notifications", SQL: sqlV3},
	{Version: 4, Name: "validate v3's checks; index the claim by kind; index finished tasks for Prune", Steps: []migrate.Step{
		{Name: "validate the state check", Run: migrate.Exec(sqlValidateStateCheck)},
		{Name: "validate the lost-policy check", Run: migrate.Exec(sqlValidateLostCheck)},
		{Name: "drop an invalid leftover of the claim index", Run: migrate.DropIfUnusable(tasksTable, indexClaim)},
		{Name: "build the claim index concurrently", Run: migrate.CreateIfAbsent(tasksTable, indexClaim, sqlCreateClaimIndex)},
		{Name: "read the claim index back", Run: migrate.RequireUsable(tasksTable, indexClaim, false, []string{"kind", "run_after"})},
		{Name: "drop an invalid leftover of the finished-task index", Run: migrate.DropIfUnusable(tasksTable, indexDone)},
		{Name: "build the finished-task index concurrently", Run: migrate.CreateIfAbsent(tasksTable, indexDone, sqlCreateDoneIndex)},
		{Name: "read the finished-task index back", Run: migrate.RequireUsable(tasksTable, indexDone, false, []string{"finished_at"})},
		{Name: "drop v1's finished-task index concurrently", Run: migrate.DropIndex(tasksTable, indexFinishedV1)},
	}},
	{Version: 5, Name: "priority; claim indexes by priority", Steps: []migrate.Step{
		{Name: "add the priority column", Run: migrate.TxExec(sqlAddPriority)},
		{Name: "drop an invalid leftover of the claim index", Run: migrate.DropIfUnusable(tasksTable, indexClaimV5)},
		{Name: "build the claim index concurrently", Run: migrate.CreateIfAbsent(tasksTable, indexClaimV5, sqlCreateClaimIndexV5)},
		{Name: "read the claim index back", Run: migrate.RequireUsable(tasksTable, indexClaimV5, false, []string{"kind", "priority", "run_after"})},
		{Name: "drop an invalid leftover of the runnable index", Run: migrate.DropIfUnusable(tasksTable, indexRunnableV5)},
		{Name: "build the runnable index concurrently", Run: migrate.CreateIfAbsent(tasksTable, indexRunnableV5, sqlCreateRunnableIndexV5)},
		{Name: "read the runnable index back", Run: migrate.RequireUsable(tasksTable, indexRunnableV5, false, []string{"priority", "run_after"})},
		{Name: "drop v4's claim index concurrently", Run: migrate.DropIndex(tasksTable, indexClaim)},
		{Name: "drop v1's runnable index concurrently", Run: migrate.DropIndex(tasksTable, indexRunnableV1)},
	}},
	{Version: 6, Name: "fair claiming (turns) and kind limits", Steps: []migrate.Step{
		{Name: "add the turn column and the kind limits table", Run: migrate.TxExec(sqlV6Schema)},
		{Name: "drop an invalid leftover of the claim index", Run: migrate.DropIfUnusable(tasksTable, indexClaimV6)},
		{Name: "build the claim index concurrently", Run: migrate.CreateIfAbsent(tasksTable, indexClaimV6, sqlCreateClaimIndexV6)},
		{Name: "read the claim index back", Run: migrate.RequireUsable(tasksTable, indexClaimV6, false, []string{"kind", "priority", "turn", "run_after"})},
		{Name: "drop an invalid leftover of the runnable index", Run: migrate.DropIfUnusable(tasksTable, indexRunnableV6)},
		{Name: "build the runnable index concurrently", Run: migrate.CreateIfAbsent(tasksTable, indexRunnableV6, sqlCreateRunnableIndexV6)},
		{Name: "read the runnable index back", Run: migrate.RequireUsable(tasksTable, indexRunnableV6, false, []string{"priority", "turn", "run_after"})},
		{Name: "drop an invalid leftover of the tenant turn index", Run: migrate.DropIfUnusable(tasksTable, indexTenantTurn)},
		{Name: "build the tenant turn index concurrently", Run: migrate.CreateIfAbsent(tasksTable, indexTenantTurn, sqlCreateTenantTurnIndex)},
		{Name: "read the tenant turn index back", Run: migrate.RequireUsable(tasksTable, indexTenantTurn, false, []string{"kind", "priority", "tenant", "turn"})},
		{Name: "drop v5's claim index concurrently", Run: migrate.DropIndex(tasksTable, indexClaimV5)},
		{Name: "drop v5's runnable index concurrently", Run: migrate.DropIndex(tasksTable, indexRunnableV5)},
	}},
	{Version: 7, Name: "bound the kind limits' rate", Steps: []migrate.Step{
		{Name: "bound starts_per_second by MaxStartsPerSecond", Run: migrate.TxExec(sqlV7BoundRate)},
	}},
	{Version: 8, Name: "scheduled tasks wait outside the claim indexes until due", Steps: []migrate.Step{
		{Name: "drop an invalid leftover of the claim index", Run: migrate.DropIfUnusable(tasksTable, indexClaimV8)},
		{Name: "build the claim index concurrently", Run: migrate.CreateIfAbsent(tasksTable, indexClaimV8, sqlCreateClaimIndexV8)},
		{Name: "read the claim index back", Run: migrate.RequireUsable(tasksTable, indexClaimV8, false, []string{"kind", "priority", "turn", "run_after"})},
		{Name: "drop an invalid leftover of the runnable index", Run: migrate.DropIfUnusable(tasksTable, indexRunnableV8)},
		{Name: "build the runnable index concurrently", Run: migrate.CreateIfAbsent(tasksTable, indexRunnableV8, sqlCreateRunnableIndexV8)},
		{Name: "read the runnable index back", Run: migrate.RequireUsable(tasksTable, indexRunnableV8, false, []string{"priority", "turn", "run_after"})},
		{Name: "drop an invalid leftover of the scheduled index", Run: migrate.DropIfUnusable(tasksTable, indexScheduled)},
		{Name: "build the scheduled index concurrently", Run: migrate.CreateIfAbsent(tasksTable, indexScheduled, sqlCreateScheduledIndex)},
		{Name: "read the scheduled index back", Run: migrate.RequireUsable(tasksTable, indexScheduled, false, []string{"run_after"})},
		{Name: "drop v6's claim index concurrently", Run: migrate.DropIndex(tasksTable, indexClaimV6)},
		{Name: "drop v6's runnable index concurrently", Run: migrate.DropIndex(tasksTable, indexRunnableV6)},
	}},
	{Version: 9, Name: "the lines with waiting tasks, for the claim's walk of capped tenants", Steps: []migrate.Step{
		{Name: "create the waiting-tenants table and its triggers, and fill it", Run: migrate.TxExec(sqlV9Waiting)},
	}},
	// v10 builds nothing: the claim of any kind reads each kind's line on
	// the claim index, so the index of every kind's waiting tasks goes,
	// and each insert writes four indexes instead of five (two of them
	// carrying the turn instead of three). Run it once no worker of an
	// earlier version claims "any kind": such a claim still works, but
	// without its index it reads every waiting task. Killed during the
	// drop, the index is left invalid (no reader uses it, writers still
	// keep it) and the rerun drops it.
	{Version: 10, Name: "drop the any-kind runnable index", Steps: []migrate.Step{
		{Name: "drop v8's runnable index concurrently", Run: migrate.DropIndex(tasksTable, indexRunnableV8)},
	}},
	{Version: 11, Name: "the schema's functions: pinned search_path, operators spelled, EXECUTE granted; lines listed under any isolation", Steps: []migrate.Step{
		{Name: "replace the functions and list the lines with waiting tasks", Run: migrate.TxExec(sqlV11Harden)},
	}},
	// v12 narrows the arbiter: a unique index on key_digest, the full
	// key's 32-byte digest (see conflictOnDigest), replaces v2's on its
	// four texts. Killed at any point,
	// it leaves v2's index or a valid digest index, or both (Submit names
	// whichever is there: see arbiter), and a rerun goes on. A node of an
	// earlier release, whose Submit names v2's index, gets an error for a
	// held key once v12 dropped it (never a second task: the digest index,
	// whose digest the trigger computes for that node's rows, refuses it):
	// run v12 once every node runs this release.
	{Version: 12, Name: "arbitrate on the key's digest", Steps: []migrate.Step{
		{Name: "add the digest column and its triggers", Run: migrate.TxExec(sqlV12DigestColumn)},
		{Name: "compute the digest of every task", Run: migrate.Exec(sqlV12Backfill)},
		{Name: "drop an invalid leftover of the digest index", Run: migrate.DropIfUnusable(tasksTable, indexKeyDigest)},
		{Name: "build the digest index concurrently", Run: migrate.CreateIfAbsent(tasksTable, indexKeyDigest, sqlCreateDigestIndex)},
		// Only a valid, ready, unique index may replace the wide one.
		{Name: "read the digest index back", Run: migrate.RequireUsable(tasksTable, indexKeyDigest, true, []string{"key_digest"})},
		{Name: "drop v2's wide index concurrently", Run: migrate.DropIndex(tasksTable, indexKeyWide)},
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
	r := migrate.Runner{
		Package:      "pgstore",
		VersionTable: "idemgate_schema_migrations",
		LockClass:    8191,
		Migrations:   migrations,
	}
	if s.test != nil {
		r.Skip = s.test.migrateSkip
		if hook := s.test.migrateStep; hook != nil {
			r.Hook = func(ctx context.Context, step string, conn *pgx.Conn) { hook(ctx, step, conn.PgConn().PID()) }
		}
	}
	return r.Run(ctx, s.pool)
}
