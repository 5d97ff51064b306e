package pgstore

import (
	"fmt"
	"strings"
)

// Every SQL statement of the package lives in this file, the schema's
// migrations included; the statements of the migration runner itself
// (version table, advisory lock, index checks) live in internal/migrate.
//
// Times that fence work (leases, run_after) are computed by the database
// (now()), never by a node's clock: one clock for every node, so a skewed
// host cannot steal a live lease. Go passes only durations, as microseconds.

// Names of the objects the schema creates, in the pool's current schema.
const (
	// tasksTable is the table whose indexes the migrations build and drop.
	tasksTable = "idemgate_tasks"
	// indexKeyNarrow is v1's unique index on (tenant, idempotency_key).
	indexKeyNarrow = "idemgate_tasks_key_v1"
	// indexKeyWide is v2's unique index on (tenant, idempotency_key,
	// runtime, network): the arbiter of Submit.
	indexKeyWide = "idemgate_tasks_key_v2"
	// indexClaim serves the claim of runnable tasks by kind (v4).
	indexClaim = "idemgate_tasks_claim"
	// indexDone serves Prune: finished tasks by finish time (v4).
	indexDone = "idemgate_tasks_done"
	// indexClaimV5 serves the claim by kind, highest priority first (v5);
	// it replaces indexClaim.
	indexClaimV5 = "idemgate_tasks_claim_v5"
	// indexRunnableV5 serves the claim of any kind, highest priority
	// first (v5); it replaces v1's indexRunnableV1 on run_after alone.
	indexRunnableV5 = "idemgate_tasks_runnable_v5"
	indexRunnableV1 = "idemgate_tasks_runnable"
	// indexFinishedV1 is v1's index of finished tasks, which v4 replaces
	// by indexDone (it did not cover cancelled tasks).
	indexFinishedV1 = "idemgate_tasks_finished"
	// notifyChannel carries a task's kind whenever it becomes runnable.
	notifyChannel = "idemgate_tasks"
	// cancelChannel carries a task's ID when it is cancelled.
	cancelChannel = "idemgate_tasks_cancel"
)

// taskColumns is the column list of Task, in the order of its fields.
const taskColumns = `id::text AS id, tenant, owner, kind, runtime, network, idempotency_key,
	fingerprint, params, trace, state, attempt, recoveries, results, error, run_after,
	priority, created_at, updated_at`

// tTaskColumns is taskColumns qualified by the alias t.
const tTaskColumns = `t.id::text AS id, t.tenant, t.owner, t.kind, t.runtime, t.network,
	t.idempotency_key, t.fingerprint, t.params, t.trace, t.state, t.attempt, t.recoveries,
	t.results, t.error, t.run_after, t.priority, t.created_at, t.updated_at`

// Migrations: the schema's SQL, which internal/migrate runs in order
// (migrate.go lists the versions).
const (
	// sqlV1 is the seed's schema: the narrow unique index.
	sqlV1 = `
CREATE TABLE idemgate_tasks (
	id              uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
	tenant          text        NOT NULL,
	owner           text        NOT NULL,
	kind            text        NOT NULL,
	runtime         text        NOT NULL,
	network         text        NOT NULL,
	idempotency_key text        NOT NULL,
	fingerprint     text        NOT NULL,
	params          jsonb,
	state           text        NOT NULL DEFAULT 'pending' CHECK (state IN
		('pending', 'running', 'retrying', 'uncertain', 'succeeded', 'failed')),
	attempt         integer     NOT NULL DEFAULT 0,
	tries           integer     NOT NULL DEFAULT 0,
	recoveries      integer     NOT NULL DEFAULT 0,
	results         jsonb       NOT NULL DEFAULT '[]',
	error           text        NOT NULL DEFAULT '',
	run_after       timestamptz NOT NULL DEFAULT now(),
	lease_until     timestamptz,
	locked_by       text,
	created_at      timestamptz NOT NULL DEFAULT now(),
	updated_at      timestamptz NOT NULL DEFAULT now(),
	finished_at     timestamptz
);
CREATE UNIQUE INDEX idemgate_tasks_key_v1 ON idemgate_tasks (tenant, idempotency_key);
CREATE INDEX idemgate_tasks_runnable ON idemgate_tasks (run_after)
	WHERE state IN ('pending', 'retrying');
CREATE INDEX idemgate_tasks_leased ON idemgate_tasks (lease_until) WHERE state = 'running';
CREATE INDEX idemgate_tasks_uncertain ON idemgate_tasks (run_after) WHERE state = 'uncertain';
CREATE INDEX idemgate_tasks_finished ON idemgate_tasks (finished_at)
	WHERE state IN ('succeeded', 'failed');
-- Wakes listening workers when the calling transaction commits (never
-- for a rolled-back task). Returns true, so a statement can call it in a
-- WHERE clause for exactly the rows it wants announced.
CREATE FUNCTION idemgate_tasks_notify(kind text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
	PERFORM pg_notify('idemgate_tasks', kind);
	RETURN true;
END $$;
`

	// sqlV3 adds what this version's API needs. Every statement is cheap
	// under its brief ACCESS EXCLUSIVE lock: columns with a constant
	// default are catalog-only, and the CHECKs are NOT VALID (v4
	// validates them without blocking writers).
	sqlV3 = `
ALTER TABLE idemgate_tasks
	ADD COLUMN trace text NOT NULL DEFAULT '',
	ADD COLUMN lost text NOT NULL DEFAULT 'retry',
	DROP CONSTRAINT idemgate_tasks_state_check,
	ADD CONSTRAINT idemgate_tasks_state_v3_check CHECK (state IN
		('pending', 'running', 'retrying', 'uncertain', 'succeeded', 'failed', 'cancelled')) NOT VALID,
	ADD CONSTRAINT idemgate_tasks_lost_check CHECK (lost IN ('retry', 'uncertain')) NOT VALID;
-- Tells workers that a task was cancelled, when the calling transaction
-- commits: the payload is the task ID.
CREATE FUNCTION idemgate_tasks_notify_cancel(id text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
	PERFORM pg_notify('idemgate_tasks_cancel', id);
	RETURN true;
END $$;
`
	// v4: validate v3's checks and index the claim by kind, both without
	// blocking writers.
	sqlValidateStateCheck = `ALTER TABLE idemgate_tasks VALIDATE CONSTRAINT idemgate_tasks_state_v3_check`
	sqlValidateLostCheck  = `ALTER TABLE idemgate_tasks VALIDATE CONSTRAINT idemgate_tasks_lost_check`
	sqlCreateClaimIndex   = `CREATE INDEX CONCURRENTLY idemgate_tasks_claim
	ON idemgate_tasks (kind, run_after) WHERE state IN ('pending', 'retrying')`
	sqlCreateDoneIndex = `CREATE INDEX CONCURRENTLY idemgate_tasks_done
	ON idemgate_tasks (finished_at) WHERE state IN ('succeeded', 'failed', 'cancelled')`

	// v5: priority. The column has a constant default, so adding it is
	// catalog-only (a brief lock); the claim indexes lead with it so that
	// a claim reads the highest priority first and stops after @limit
	// rows, never reading a lower priority's backlog. They replace v4's
	// (kind, run_after) and v1's (run_after) indexes: as many indexes to
	// keep up on every insert as before.
	sqlAddPriority = `ALTER TABLE idemgate_tasks
	ADD COLUMN IF NOT EXISTS priority smallint NOT NULL DEFAULT 0`
	sqlCreateClaimIndexV5 = `CREATE INDEX CONCURRENTLY idemgate_tasks_claim_v5
	ON idemgate_tasks (kind, priority DESC, run_after) WHERE state IN ('pending', 'retrying')`
	sqlCreateRunnableIndexV5 = `CREATE INDEX CONCURRENTLY idemgate_tasks_runnable_v5
	ON idemgate_tasks (priority DESC, run_after) WHERE state IN ('pending', 'retrying')`

	// v2: widen the key. No IF NOT EXISTS: a leftover of a killed build is
	// invalid and must be dropped, never trusted.
	sqlCreateWideIndex = `CREATE UNIQUE INDEX CONCURRENTLY idemgate_tasks_key_v2
	ON idemgate_tasks (tenant, idempotency_key, runtime, network)`
)

// Submit and reads.
const (
	// sqlSubmit inserts the task, or returns the row that holds its key,
	// in one statement. DO NOTHING instead of river's DO UPDATE: a
	// duplicate writes nothing (no dead tuple, no row lock, no WAL) and
	// is still one round trip. The lookup runs on the statement's
	// snapshot, so a winner that committed after it began is not seen:
	// then no row comes back and the caller runs the statement again.
	// @notify asks for a NOTIFY, sent with the commit, for an inserted row
	// that may run now only (a scheduled one is found by polling).
	// @run_after NULL or past is now() (greatest ignores NULL): a task
	// takes its place in line when submitted, never before.
	sqlSubmit = `WITH ins AS (
	INSERT INTO idemgate_tasks AS t
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, params, trace,
		run_after, priority)
	VALUES (@tenant, @owner, @kind, @runtime, @network, @key, @fingerprint, @params, @trace,
		greatest(@run_after::timestamptz, now()), @priority)
	ON CONFLICT (tenant, idempotency_key, runtime, network) DO NOTHING
	RETURNING ` + tTaskColumns + `
)
SELECT *, false AS duplicate FROM ins
WHERE NOT @notify::boolean OR ins.run_after > now() OR idemgate_tasks_notify(ins.kind)
UNION ALL
SELECT ` + taskColumns + `, true AS duplicate FROM idemgate_tasks
WHERE tenant = @tenant AND idempotency_key = @key AND runtime = @runtime AND network = @network
	AND NOT EXISTS (SELECT FROM ins)`

	// sqlSubmitPlain is Submit while the wide index is not (yet) valid, as
	// during the v2 build: a conflict surfaces as a unique violation whose
	// constraint name tells which index caught it.
	sqlSubmitPlain = `WITH ins AS (
	INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, params, trace,
		run_after, priority)
	VALUES (@tenant, @owner, @kind, @runtime, @network, @key, @fingerprint, @params, @trace,
		greatest(@run_after::timestamptz, now()), @priority)
	RETURNING ` + taskColumns + `
)
SELECT *, false AS duplicate FROM ins
WHERE NOT @notify::boolean OR ins.run_after > now() OR idemgate_tasks_notify(ins.kind)`

	// sqlSubmitMany is Submit of a batch, in one statement: the tasks come
	// as one array per column (@run_afters NULL or past is now()). A key given
	// twice is inserted once, by its first item. Rows are inserted in key
	// order, so two batches that share keys wait for each other's keys in
	// the same order and never deadlock. Each item gets one row: the row
	// it inserted (duplicate false), the row an earlier item of the batch
	// inserted, or the row that held its key (duplicate true); an item
	// whose key is held by a row this snapshot cannot see gets none, and
	// the caller runs it again. Inserted rows of a kind in @notify_kinds
	// that may run now are announced (Postgres sends one NOTIFY per kind
	// and transaction).
	sqlSubmitMany = `WITH x AS (
	SELECT *, min(ord) OVER (PARTITION BY tenant, key, runtime, network) AS first_ord
	FROM unnest(@tenants::text[], @owners::text[], @kinds::text[], @runtimes::text[], @networks::text[],
		@keys::text[], @fingerprints::text[], @params::jsonb[], @traces::text[],
		@run_afters::timestamptz[], @priorities::smallint[])
		WITH ORDINALITY AS u(tenant, owner, kind, runtime, network, key, fingerprint, params, trace,
			run_after, priority, ord)
), ins AS (
	INSERT INTO idemgate_tasks AS t
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, params, trace,
		run_after, priority)
	SELECT tenant, owner, kind, runtime, network, key, fingerprint, params, trace,
		greatest(run_after, now()), priority
	FROM x WHERE ord = first_ord
	ORDER BY tenant, key, runtime, network
	ON CONFLICT (tenant, idempotency_key, runtime, network) DO NOTHING
	RETURNING ` + tTaskColumns + `
)
SELECT x.ord, ins.*, x.ord <> x.first_ord AS duplicate
FROM x JOIN ins ON ins.tenant = x.tenant AND ins.idempotency_key = x.key
	AND ins.runtime = x.runtime AND ins.network = x.network
WHERE NOT (ins.kind = ANY(coalesce(@notify_kinds::text[], '{}')) AND ins.run_after <= now())
	OR idemgate_tasks_notify(ins.kind)
UNION ALL
SELECT x.ord, ` + tTaskColumns + `, true AS duplicate
FROM x JOIN idemgate_tasks t ON t.tenant = x.tenant AND t.idempotency_key = x.key
	AND t.runtime = x.runtime AND t.network = x.network
WHERE NOT EXISTS (SELECT FROM ins WHERE ins.tenant = x.tenant AND ins.idempotency_key = x.key
	AND ins.runtime = x.runtime AND ins.network = x.network)`

	// sqlByKey reads a task back by its full key.
	sqlByKey = `SELECT ` + taskColumns + `, true AS duplicate FROM idemgate_tasks
WHERE tenant = @tenant AND idempotency_key = @key AND runtime = @runtime AND network = @network`

	// sqlGet scopes the lookup to the caller: anyone else's task is absent.
	sqlGet = `SELECT ` + taskColumns + `, false AS duplicate FROM idemgate_tasks
WHERE id = @id::uuid AND tenant = @tenant AND owner = @owner`

	// sqlRecover puts a failed task that kept partial results back in line,
	// on the same row. A partial result is a real item: not JSON null, the
	// rule a success is held to. tries restarts (a fresh attempt budget);
	// attempt, the fencing token, never goes back.
	sqlRecover = `WITH rec AS (
	UPDATE idemgate_tasks SET state = 'retrying', tries = 0,
		recoveries = recoveries + 1, error = '', run_after = now(), finished_at = NULL,
		updated_at = now()
	WHERE id = @id::uuid AND tenant = @tenant AND owner = @owner AND state = 'failed'
		AND EXISTS (SELECT FROM jsonb_array_elements(results) AS r(item) WHERE r.item <> 'null'::jsonb)
		AND recoveries < @max_recoveries
	RETURNING ` + taskColumns + `
)
SELECT *, false AS duplicate FROM rec WHERE idemgate_tasks_notify(rec.kind)`

	// sqlCancel ends an unfinished task as cancelled and tells the workers,
	// whose running attempt of it (if any) then stops. A finished task is
	// left alone: nothing comes back, and the caller reads it to say why.
	sqlCancel = `WITH can AS (
	UPDATE idemgate_tasks SET state = 'cancelled', error = 'cancelled',
		lease_until = NULL, locked_by = NULL, finished_at = now(), updated_at = now()
	WHERE id = @id::uuid AND tenant = @tenant AND owner = @owner
		AND state IN ('pending', 'running', 'retrying', 'uncertain')
	RETURNING ` + taskColumns + `
)
SELECT *, false AS duplicate FROM can WHERE idemgate_tasks_notify_cancel(can.id)`

	// sqlPrune deletes one batch of tasks that finished more than
	// @older_us ago (and so were submitted before that too); SKIP LOCKED
	// keeps it out of the way of anything touching those rows. The state
	// list is the predicate of the finished-task index.
	sqlPrune = `WITH doomed AS (
	SELECT id FROM idemgate_tasks
	WHERE state IN ('succeeded', 'failed', 'cancelled')
		AND finished_at < now() - @older_us::bigint * interval '1 microsecond'
	ORDER BY finished_at
	LIMIT @limit
	FOR UPDATE SKIP LOCKED
)
DELETE FROM idemgate_tasks t USING doomed WHERE t.id = doomed.id`

	// sqlStats counts unfinished tasks by kind and state, with each group's
	// oldest runnable and oldest task, in µs of age. Each arm's WHERE
	// clause implies the predicate of one partial index (runnable_v5,
	// leased, uncertain): Postgres matches a partial index to a state
	// list only if the list is within the index's, so one arm for all
	// four states would read the whole table, finished tasks and all.
	// Cost grows with the unfinished tasks only.
	sqlStats = `SELECT kind, state, count(*)::bigint AS n,
	coalesce((extract(epoch FROM now() - min(run_after) FILTER (WHERE run_after <= now())) * 1e6)::bigint, 0) AS runnable_us,
	0::bigint AS oldest_us
FROM idemgate_tasks WHERE state IN ('pending', 'retrying') GROUP BY kind, state
UNION ALL
SELECT kind, state, count(*)::bigint, 0, 0
FROM idemgate_tasks WHERE state = 'running' GROUP BY kind, state
UNION ALL
SELECT kind, state, count(*)::bigint, 0,
	coalesce((extract(epoch FROM now() - min(created_at)) * 1e6)::bigint, 0)
FROM idemgate_tasks WHERE state = 'uncertain' GROUP BY kind, state`
)

// claimKindsSQL is sqlClaim for some kinds only. Each kind is read from
// the claim index (kind, priority DESC, run_after) by a CTE of its own
// that names the kind as a literal, so that the planner, which knows how
// common each kind is, never walks the index of all runnable tasks past
// another kind's backlog (with a parameter, a generic plan may). Of all
// kinds' candidates, the highest priority and then the oldest come
// first. Every kind must pass literalKind.
func claimKindsSQL(kinds []string) string {
	var b strings.Builder
	b.WriteString("WITH ")
	for i, kind := range kinds {
		fmt.Fprintf(&b, `k%d AS (
	SELECT id, priority, run_after FROM idemgate_tasks
	WHERE kind = '%s' AND state IN ('pending', 'retrying') AND run_after <= now()
		AND id <> ALL(coalesce(@held::uuid[], '{}'))
	ORDER BY priority DESC, run_after
	LIMIT @limit
	FOR UPDATE SKIP LOCKED
), `, i, kind)
	}
	b.WriteString("picked AS (\n\tSELECT id FROM (")
	for i := range kinds {
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		fmt.Fprintf(&b, "SELECT * FROM k%d", i)
	}
	b.WriteString(`) r
	ORDER BY priority DESC, run_after
	LIMIT @limit
)
UPDATE idemgate_tasks t SET ` + claimSet + `
FROM picked WHERE t.id = picked.id
RETURNING ` + tTaskColumns + `, false AS duplicate`)
	return b.String()
}

// literalKind reports whether kind can be written into SQL as a literal
// as it is: letters, digits and a few punctuation marks, no quote, no
// backslash (keyspace's kinds all can).
func literalKind(kind string) bool {
	if kind == "" || len(kind) > 128 {
		return false
	}
	for _, c := range []byte(kind) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("_-.:/", c) >= 0) {
			return false
		}
	}
	return true
}

// sqlClaimAnyOf is sqlClaim for kinds that cannot be literals: correct,
// but the planner may scan other kinds' backlog.
const sqlClaimAnyOf = `WITH picked AS (
	SELECT id FROM idemgate_tasks
	WHERE kind = ANY(@kinds::text[]) AND state IN ('pending', 'retrying') AND run_after <= now()
		AND id <> ALL(coalesce(@held::uuid[], '{}'))
	ORDER BY priority DESC, run_after
	LIMIT @limit
	FOR UPDATE SKIP LOCKED
)
UPDATE idemgate_tasks t SET ` + claimSet + `
FROM picked WHERE t.id = picked.id
RETURNING ` + tTaskColumns + `, false AS duplicate`

// Workers. Every transition of a claimed task is fenced by
// WHERE id = @id AND attempt = @attempt AND state = <the state it was
// claimed in>. Durations are microseconds (@…_us).
//
// A lease's end in the row (lease_until) is the claim's or heartbeat's
// now() plus the lease plus a margin; the worker holding it gives up the
// attempt at its own send time plus the lease minus that margin. So the
// holder stops, by its own clock, a margin before the lease ends and
// another margin before any rescuer may take the task.
const (
	// claimSet is the SET list of a claim: the attempt's lease and the
	// kind's lost-attempt policy, which rescuers apply to the row.
	claimSet = `state = 'running', attempt = t.attempt + 1, tries = t.tries + 1,
	lease_until = now() + @lease_us::bigint * interval '1 microsecond', locked_by = @worker,
	lost = CASE WHEN t.kind = ANY(@uncertain_kinds::text[]) THEN 'uncertain' ELSE 'retry' END,
	updated_at = now()`

	// sqlClaim takes up to @limit runnable tasks of any kind, highest
	// priority first, then oldest: river's shape, a SKIP LOCKED CTE
	// feeding one UPDATE … RETURNING. @held are tasks whose earlier attempt still runs in this
	// worker: it never runs two attempts of one task.
	sqlClaim = `WITH picked AS (
	SELECT id FROM idemgate_tasks
	WHERE state IN ('pending', 'retrying') AND run_after <= now()
		AND id <> ALL(coalesce(@held::uuid[], '{}'))
	ORDER BY priority DESC, run_after
	LIMIT @limit
	FOR UPDATE SKIP LOCKED
)
UPDATE idemgate_tasks t SET ` + claimSet + `
FROM picked WHERE t.id = picked.id
RETURNING ` + tTaskColumns + `, false AS duplicate`

	// sqlClaimUncertain takes uncertain tasks due for reconciliation. The
	// state stays uncertain; run_after moves past the lease so no other
	// worker reconciles the task meanwhile, and attempt is the fence.
	sqlClaimUncertain = `WITH picked AS (
	SELECT id FROM idemgate_tasks
	WHERE state = 'uncertain' AND run_after <= now()
		AND (cardinality(@kinds::text[]) = 0 OR kind = ANY(@kinds::text[]))
		AND id <> ALL(coalesce(@held::uuid[], '{}'))
	ORDER BY run_after
	LIMIT @limit
	FOR UPDATE SKIP LOCKED
)
UPDATE idemgate_tasks t SET attempt = t.attempt + 1,
	run_after = now() + @lease_us::bigint * interval '1 microsecond', locked_by = @worker,
	updated_at = now()
FROM picked WHERE t.id = picked.id
RETURNING ` + tTaskColumns + `, false AS duplicate`

	// sqlFinishBatch ends many running tasks, each succeeded or failed,
	// with its results and error: the hot path of a busy worker, one
	// statement per batch. Each row is fenced like a single transition.
	sqlFinishBatch = `UPDATE idemgate_tasks t SET state = x.state, results = x.results, error = x.error,
	lease_until = NULL, locked_by = NULL, finished_at = now(), updated_at = now()
FROM unnest(@ids::text[], @attempts::int[], @states::text[], @results::jsonb[], @errors::text[])
	AS x(id, attempt, state, results, error)
WHERE t.id = x.id::uuid AND t.attempt = x.attempt AND t.state = 'running'
RETURNING t.id::text`

	// sqlFinish ends a task: succeeded or failed (@to), with results and error.
	sqlFinish = `UPDATE idemgate_tasks SET state = @to, results = @results, error = @error,
	lease_until = NULL, locked_by = NULL, finished_at = now(), updated_at = now()
WHERE id = @id::uuid AND attempt = @attempt AND state = @from
RETURNING state`

	// sqlUncertain parks a task until a reconcile check in @after_us.
	sqlUncertain = `UPDATE idemgate_tasks SET state = 'uncertain', error = @error,
	run_after = now() + @after_us::bigint * interval '1 microsecond',
	lease_until = NULL, locked_by = NULL, updated_at = now()
WHERE id = @id::uuid AND attempt = @attempt AND state = @from
RETURNING state`

	// backoff is the delay before try number tries + 1, in µs:
	// min(@backoff_max_us, @backoff_base_us·2^(tries−1)), less a random
	// jitter of up to @jitter of it.
	backoff = `least(@backoff_max_us::float8, @backoff_base_us::float8 * power(2, least(greatest(tries - 1, 0), 40)))
	* (1 - @jitter::float8 * random())`

	// tBackoff is backoff for the alias t.
	tBackoff = `least(@backoff_max_us::float8, @backoff_base_us::float8 * power(2, least(greatest(t.tries - 1, 0), 40)))
	* (1 - @jitter::float8 * random())`

	// sqlRetry requeues a task after @after_us, or after the backoff when
	// @after_us < 0; past @max_attempts tries it fails instead.
	sqlRetry = `UPDATE idemgate_tasks SET
	state = CASE WHEN tries >= @max_attempts::int THEN 'failed' ELSE 'retrying' END,
	error = CASE WHEN tries >= @max_attempts::int THEN 'gave up after ' || tries || ' attempts: ' || @error::text
		ELSE @error::text END,
	run_after = now() + (CASE WHEN @after_us::bigint >= 0 THEN @after_us::bigint::float8
		ELSE ` + backoff + ` END) * interval '1 microsecond',
	finished_at = CASE WHEN tries >= @max_attempts::int THEN now() END,
	lease_until = NULL, locked_by = NULL, updated_at = now()
WHERE id = @id::uuid AND attempt = @attempt AND state = @from
RETURNING state`

	// sqlRelease hands a task back at shutdown, by its kind's policy: to
	// run again at once, or, when an upstream call may have happened, as
	// uncertain for a reconcile check in @reconcile_us. The attempt
	// counts, like an expired lease: a handler that never finishes within
	// the shutdown deadline would otherwise come back at every restart for
	// ever. Past @max_attempts tries the task fails instead. Only a
	// requeued task is announced.
	sqlRelease = `WITH rel AS (
	UPDATE idemgate_tasks SET
		state = CASE WHEN lost = 'uncertain' THEN 'uncertain'
			WHEN tries >= @max_attempts::int THEN 'failed' ELSE 'retrying' END,
		error = CASE WHEN lost = 'uncertain' THEN 'released at shutdown on attempt ' || tries
				|| ': the upstream outcome is unknown'
			WHEN tries >= @max_attempts::int THEN 'released at shutdown on attempt ' || tries || ' of '
				|| @max_attempts::int || ': the handler did not finish in time'
			ELSE error END,
		finished_at = CASE WHEN lost <> 'uncertain' AND tries >= @max_attempts::int THEN now() END,
		run_after = CASE WHEN lost = 'uncertain' THEN now() + @reconcile_us::bigint * interval '1 microsecond'
			ELSE now() END,
		lease_until = NULL, locked_by = NULL, updated_at = now()
	WHERE id = @id::uuid AND attempt = @attempt AND state = 'running'
	RETURNING kind, state
)
SELECT state FROM rel WHERE CASE WHEN rel.state = 'retrying' THEN idemgate_tasks_notify(rel.kind) ELSE true END`

	// sqlHeartbeat extends the leases of every task a worker holds and
	// returns those it still holds.
	sqlHeartbeat = `UPDATE idemgate_tasks t
SET lease_until = now() + @lease_us::bigint * interval '1 microsecond'
FROM unnest(@ids::text[], @attempts::int[]) AS x(id, attempt)
WHERE t.id = x.id::uuid AND t.attempt = x.attempt AND t.state = 'running'
RETURNING t.id::text AS id, t.attempt`

	// sqlRescue takes back tasks whose lease ran out (their worker died,
	// hung or was cut off) by each row's lost-attempt policy: uncertain,
	// for a reconcile check in @reconcile_us; or requeued with backoff
	// and jitter, failed past @max_attempts tries.
	sqlRescue = `WITH expired AS (
	SELECT id FROM idemgate_tasks
	WHERE state = 'running' AND lease_until < now()
	ORDER BY lease_until
	LIMIT @limit
	FOR UPDATE SKIP LOCKED
)
UPDATE idemgate_tasks t SET
	state = CASE WHEN t.lost = 'uncertain' THEN 'uncertain'
		WHEN t.tries >= @max_attempts::int THEN 'failed' ELSE 'retrying' END,
	error = CASE WHEN t.lost = 'uncertain' THEN 'lease expired on attempt ' || t.tries
			|| ': the upstream outcome is unknown'
		WHEN t.tries >= @max_attempts::int THEN 'lease expired on attempt ' || t.tries || ' of ' || @max_attempts::int
		ELSE 'lease expired' END,
	run_after = now() + (CASE WHEN t.lost = 'uncertain' THEN @reconcile_us::bigint::float8
		ELSE ` + tBackoff + ` END) * interval '1 microsecond',
	finished_at = CASE WHEN t.lost <> 'uncertain' AND t.tries >= @max_attempts::int THEN now() END,
	lease_until = NULL, locked_by = NULL, updated_at = now()
FROM expired WHERE t.id = expired.id
RETURNING t.id::text AS id, t.kind, t.attempt, t.state`
)
