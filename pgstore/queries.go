package pgstore

import (
	"fmt"
	"slices"
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
	// indexKeyDigest is v12's unique index on key_digest, the full key's
	// digest: the arbiter of Submit since v12, which drops indexKeyWide.
	indexKeyDigest = "idemgate_tasks_key_v12"
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
	// indexClaimV6 serves the fair claim by kind: highest priority first,
	// then tenants in turn (v6); it replaces indexClaimV5.
	indexClaimV6 = "idemgate_tasks_claim_v6"
	// indexRunnableV6 serves the fair claim of any kind (v6); it replaces
	// indexRunnableV5.
	indexRunnableV6 = "idemgate_tasks_runnable_v6"
	// indexTenantTurn finds a tenant's last turn in a kind and priority
	// (v6), so that Submit can give its next task the turn after.
	indexTenantTurn = "idemgate_tasks_tenant_turn"
	// indexClaimV8 serves the claim by kind as indexClaimV6 did, without
	// the tasks waiting for their RunAfter to be given a turn (v8); it
	// replaces indexClaimV6.
	indexClaimV8 = "idemgate_tasks_claim_v8"
	// indexRunnableV8 served the claim of any kind the same way (v8); it
	// replaced indexRunnableV6. v10 drops it: the claim of any kind reads
	// each kind on indexClaimV8 (waitingKinds), and every insert writes
	// one index fewer.
	indexRunnableV8 = "idemgate_tasks_runnable_v8"
	// indexScheduled finds the tasks waiting for their RunAfter to be
	// given a turn, by RunAfter (v8).
	indexScheduled = "idemgate_tasks_scheduled"
	// notifyChannel carries a task's kind whenever it becomes runnable.
	notifyChannel = "idemgate_tasks"
	// cancelChannel carries a task's ID when it is cancelled.
	cancelChannel = "idemgate_tasks_cancel"
	// limitsChannel carries a kind whose limits were set.
	limitsChannel = "idemgate_kind_limits"
)

// taskColumns is the column list of Task, in the order of its fields.
// The state is the one a task shows (see shownState).
const taskColumns = `id::text AS id, tenant, owner, kind, runtime, network, idempotency_key,
	fingerprint, params, trace, ` + shownState + ` AS state, attempt, recoveries, results, error, run_after,
	priority, created_at, updated_at`

// tTaskColumns is taskColumns qualified by the alias t.
const tTaskColumns = `t.id::text AS id, t.tenant, t.owner, t.kind, t.runtime, t.network,
	t.idempotency_key, t.fingerprint, t.params, t.trace, ` + tShownState + ` AS state, t.attempt, t.recoveries,
	t.results, t.error, t.run_after, t.priority, t.created_at, t.updated_at`

// Cancelling an attempt that holds its task. Store.Cancel of a task whose
// attempt holds it (a running task with a lease that has not ended, or
// an uncertain one whose Reconcile's claim has not lapsed) records the
// cancellation in finished_at and leaves the row as it is (state, lease,
// claim): the attempt keeps counting against its kind's limits and keeps
// its task from a second attempt until its handler has returned and its
// worker wrote the end (every write of the attempt ends the task as
// cancelled then), or, if the worker died, until its lease ends and a
// rescue does. So finished_at set on a running or uncertain row means
// "cancelled; the attempt is stopping", and the row shows as cancelled
// (shownState) to every reader.
const (
	// shownState is the state of a task as readers see it.
	shownState = `CASE WHEN finished_at IS NOT NULL AND state IN ('running', 'uncertain') THEN 'cancelled' ELSE state END`
	// tShownState is shownState qualified by the alias t.
	tShownState = `CASE WHEN t.finished_at IS NOT NULL AND t.state IN ('running', 'uncertain') THEN 'cancelled' ELSE t.state END`
	// heldByAttempt is true of a task t held by an attempt: the claim's
	// holding predicate (an attempt that counts against its kind's
	// limits), on t.
	heldByAttempt = `(t.state = 'running' AND t.lease_until > now()
		OR t.state = 'uncertain' AND t.locked_by IS NOT NULL AND t.run_after > now())`
)

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

	// v6: fair claiming and kind limits. turn is a task's place in the
	// line of its kind and priority, counted per tenant (see turnOf);
	// rows from before v6 have none and go first, oldest first. The
	// column has no default, so adding it is catalog-only; the limits
	// table is new. The claim indexes lead with (kind,) priority and turn
	// so that a claim reads the next turns and stops after @limit rows.
	sqlV6Schema = `ALTER TABLE idemgate_tasks ADD COLUMN IF NOT EXISTS turn bigint;
CREATE TABLE IF NOT EXISTS idemgate_kind_limits (
	kind                   text        PRIMARY KEY,
	max_running            integer     NOT NULL DEFAULT 0 CHECK (max_running >= 0),
	max_running_per_tenant integer     NOT NULL DEFAULT 0 CHECK (max_running_per_tenant >= 0),
	starts_per_second      float8      NOT NULL DEFAULT 0 CHECK (starts_per_second >= 0
		AND starts_per_second < 'Infinity'),
	paused                 boolean     NOT NULL DEFAULT false,
	tokens                 float8      NOT NULL DEFAULT 0,
	refilled_at            timestamptz NOT NULL DEFAULT now(),
	updated_at             timestamptz NOT NULL DEFAULT now()
)`
	sqlCreateClaimIndexV6 = `CREATE INDEX CONCURRENTLY idemgate_tasks_claim_v6
	ON idemgate_tasks (kind, priority DESC, turn NULLS FIRST, run_after) WHERE state IN ('pending', 'retrying')`
	sqlCreateRunnableIndexV6 = `CREATE INDEX CONCURRENTLY idemgate_tasks_runnable_v6
	ON idemgate_tasks (priority DESC, turn NULLS FIRST, run_after) WHERE state IN ('pending', 'retrying')`
	sqlCreateTenantTurnIndex = `CREATE INDEX CONCURRENTLY idemgate_tasks_tenant_turn
	ON idemgate_tasks (kind, priority, tenant, turn) WHERE state IN ('pending', 'retrying')`

	// v7: bound starts_per_second by MaxStartsPerSecond. A faster rate
	// stored before (refused by SetKindLimits since) becomes the bound;
	// the table is small, so the check is validated at once. Safe to run
	// again: the check is dropped and added in one statement.
	sqlV7BoundRate = `UPDATE idemgate_kind_limits SET starts_per_second = 1e6, tokens = least(tokens, 1e6)
	WHERE starts_per_second > 1e6;
ALTER TABLE idemgate_kind_limits DROP CONSTRAINT IF EXISTS idemgate_kind_limits_rate_check,
	ADD CONSTRAINT idemgate_kind_limits_rate_check CHECK (starts_per_second <= 1e6)`

	// v8: a task submitted for later (RunAfter ahead) takes no turn until
	// it is due: its turn is unplaced (-1) and the claim indexes leave it
	// out, so that neither a claim nor Submit's next-turn lookup reads
	// past scheduled tasks, and a scheduled backlog pushes no one's due
	// tasks back. A claim gives due ones their turn (dueUnplaced). Rows
	// from before v8 keep their turns and stay in the new indexes.
	sqlCreateClaimIndexV8 = `CREATE INDEX CONCURRENTLY idemgate_tasks_claim_v8
	ON idemgate_tasks (kind, priority DESC, turn NULLS FIRST, run_after)
	WHERE state IN ('pending', 'retrying') AND (turn IS NULL OR turn >= 0)`
	//
	// The runnable index also said attempt >= 0, true of every row, which
	// only the claim of any kind stated: so no lookup of one kind's line
	// could use it. The planner estimates a kind's share of
	// the index from the whole table, and chose it for a kind whose tasks
	// are all scheduled (absent from the index), reading past every other
	// kind's backlog (1,151 buffers at 50k) in Submit and the claim.
	sqlCreateRunnableIndexV8 = `CREATE INDEX CONCURRENTLY idemgate_tasks_runnable_v8
	ON idemgate_tasks (priority DESC, turn NULLS FIRST, run_after)
	WHERE state IN ('pending', 'retrying') AND (turn IS NULL OR turn >= 0) AND attempt >= 0`
	sqlCreateScheduledIndex = `CREATE INDEX CONCURRENTLY idemgate_tasks_scheduled
	ON idemgate_tasks (run_after) WHERE state IN ('pending', 'retrying') AND turn = -1`

	// v9: the lines that may have tasks waiting. A claim of a kind whose
	// tenants with work are nearly all at MaxRunningPerTenant walks the
	// kind's tenants to find those within their limit; walked on the
	// tenant_turn index it cost one descent a tenant (4,365 buffers at
	// 1,000 capped tenants, 12x the claim without the limit). This table
	// has one short row a line, so the walk reads the kind's tenants a
	// hundred or more to a page and looks up the waiting tasks of only
	// the tenants within their limit.
	//
	// It is a superset: every line with a placed waiting task (pending or
	// retrying, turn NULL or >= 0) has its row, committed with the task;
	// a row may outlive its line's last task until sweepWaiting removes
	// it. Statement triggers keep it, so every writer of a waiting task
	// (Submit, SubmitMany, a claim placing a due scheduled task, retries,
	// releases, rescues, an operator's retry, hand-written SQL) adds its
	// lines without a statement of its own; a line already listed costs
	// an index probe, no write. Every statement lists its lines once, in
	// key order: two statements that each list new lines (a SubmitMany, a
	// rescue of many tenants' tasks, claims placing due tasks) wait for
	// each other's new rows in one order and never deadlock. (Updates were
	// listed a row at a time, in the order the rows were updated: a rescue
	// and a SubmitMany of the same new lines could deadlock.) The
	// function is one statement, each line locked (the lateral call) just
	// before its row is inserted: 39 µs a Submit, against 118 µs for a
	// lock statement and an insert statement (EXPLAIN ANALYZE, median of
	// 400, load 20). Two transactions that list new lines in several
	// statements each (SubmitTx) can still deadlock; and a transaction
	// that lists a new line holds its row until it commits. Each line is locked shared (advisory, the
	// class 8193) before its row is added: the sweep takes the exclusive
	// lock before it reads whether a line is empty, so a writer that has
	// inserted a task but not yet its line either holds the lock (the
	// sweep skips the line) or waits until the sweep has committed, then
	// adds the row again. The locks are 64, each line's the hash of the
	// line modulo 64: a statement that writes the tasks of 10,000 tenants
	// holds at most 64 (one lock a line would fill the server's lock
	// table, sized by max_locks_per_transaction, and fail with "out of
	// shared memory"), at the price of a sweep skipping or delaying the
	// writers of other lines that share a lock.
	//
	// The function keeps the migration's search_path, so that a writer
	// whose search_path differs lists its lines in the table beside the
	// tasks it wrote.
	//
	// The step runs in one transaction: CREATE TRIGGER locks the tasks
	// table against writes until it commits, so the backfill sees every
	// waiting task and none is written without the trigger.
	sqlV9Waiting = `CREATE TABLE IF NOT EXISTS idemgate_waiting_tenants (
	kind     text     NOT NULL,
	priority smallint NOT NULL,
	tenant   text     NOT NULL,
	listed_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (kind, priority, tenant)
);
CREATE OR REPLACE FUNCTION idemgate_tasks_waiting() RETURNS trigger LANGUAGE plpgsql
	SET search_path FROM CURRENT AS $$
BEGIN
	INSERT INTO idemgate_waiting_tenants (kind, priority, tenant)
	SELECT w.kind, w.priority, w.tenant
	FROM (SELECT DISTINCT n.kind, n.priority, n.tenant FROM idemgate_new_tasks n
		WHERE n.state IN ('pending', 'retrying') AND (n.turn IS NULL OR n.turn >= 0) ORDER BY 1, 2, 3) w
	CROSS JOIN LATERAL pg_advisory_xact_lock_shared(8193, hashtext(w.kind || '/' || w.priority || '/' || w.tenant) & 63) l
	ON CONFLICT DO NOTHING;
	RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS idemgate_tasks_waiting_insert ON idemgate_tasks;
CREATE TRIGGER idemgate_tasks_waiting_insert AFTER INSERT ON idemgate_tasks
	REFERENCING NEW TABLE AS idemgate_new_tasks FOR EACH STATEMENT EXECUTE FUNCTION idemgate_tasks_waiting();
DROP TRIGGER IF EXISTS idemgate_tasks_waiting_update ON idemgate_tasks;
DROP FUNCTION IF EXISTS idemgate_tasks_waiting_row();
CREATE TRIGGER idemgate_tasks_waiting_update AFTER UPDATE ON idemgate_tasks
	REFERENCING NEW TABLE AS idemgate_new_tasks FOR EACH STATEMENT EXECUTE FUNCTION idemgate_tasks_waiting();
CREATE OR REPLACE FUNCTION idemgate_sweep_waiting(after_kind text, after_priority smallint, after_tenant text,
	batch integer, min_age_us bigint, OUT examined bigint, OUT last_kind text, OUT last_priority smallint, OUT last_tenant text,
	OUT removed bigint) LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
	ks text[];
	ps smallint[];
	ts text[];
BEGIN
	removed := 0;
	WITH b AS (
		SELECT w.kind, w.priority, w.tenant, w.listed_at FROM idemgate_waiting_tenants w
		WHERE (w.kind, w.priority, w.tenant) > (after_kind, after_priority, after_tenant)
		ORDER BY w.kind, w.priority, w.tenant
		LIMIT batch
	), e AS (
		SELECT w.kind, w.priority, w.tenant FROM (SELECT * FROM b w
			WHERE w.listed_at <= now() - min_age_us * interval '1 microsecond' AND ` + waitingEmpty + ` OFFSET 0) w
		WHERE pg_try_advisory_xact_lock(8193, hashtext(w.kind || '/' || w.priority || '/' || w.tenant) & 63)
	)
	SELECT (SELECT count(*) FROM b), l.kind, l.priority, l.tenant, a.ks, a.ps, a.ts
	INTO examined, last_kind, last_priority, last_tenant, ks, ps, ts
	FROM (SELECT array_agg(kind) AS ks, array_agg(priority) AS ps, array_agg(tenant) AS ts FROM e) a
	LEFT JOIN LATERAL (SELECT * FROM b ORDER BY kind DESC, priority DESC, tenant DESC LIMIT 1) l ON true;
	-- Only READ COMMITTED gives the next statement a snapshot newer than
	-- the locks; under another isolation the lines are left for a sweep
	-- that runs under it.
	IF ks IS NULL OR current_setting('transaction_isolation') <> 'read committed' THEN
		RETURN;
	END IF;
	DELETE FROM idemgate_waiting_tenants w
	USING unnest(ks, ps, ts) AS e(kind, priority, tenant)
	WHERE w.kind = e.kind AND w.priority = e.priority AND w.tenant = e.tenant AND ` + waitingEmpty + `;
	GET DIAGNOSTICS removed = ROW_COUNT;
END $$;
INSERT INTO idemgate_waiting_tenants (kind, priority, tenant)
SELECT DISTINCT kind, priority, tenant FROM idemgate_tasks
WHERE state IN ('pending', 'retrying') AND (turn IS NULL OR turn >= 0)
ON CONFLICT DO NOTHING`

	// v2: widen the key. No IF NOT EXISTS: a leftover of a killed build is
	// invalid and must be dropped, never trusted.
	sqlCreateWideIndex = `CREATE UNIQUE INDEX CONCURRENTLY idemgate_tasks_key_v2
	ON idemgate_tasks (tenant, idempotency_key, runtime, network)`
)

// v11: the schema's functions, hardened. Each runs with search_path
// pg_catalog, the schema, pg_temp (pinned: a caller's search_path never
// applies, a temporary table never shadows the schema's), and spells
// every operator OPERATOR(pg_catalog.…) and every function call
// pg_catalog.…: pinning alone would not do, since the schema (public,
// often) is on the path, and an operator or function planted there with
// the exact argument types of a call that pg_catalog serves only through
// a cast or a polymorphic type (bigint * interval, text || smallint,
// array_agg(text)) would be chosen over pg_catalog's. EXECUTE is revoked
// from PUBLIC and granted to the roles that may write the tasks table
// when v11 runs, its owner included (whose rights are in no ACL until
// someone grants on the table; acldefault spells them) (a trigger
// function needs no grant to fire). An
// OPERATOR(…) binds as any user-defined operator (left to right, tighter
// than comparisons): each is parenthesized.
//
// The trigger lists its lines under any isolation level. Under
// REPEATABLE READ or SERIALIZABLE, INSERT … ON CONFLICT DO NOTHING
// fails (40001, "could not serialize access due to concurrent update",
// no detail) when the conflicting row was committed after the
// transaction's snapshot: the line is listed, by another transaction
// (SubmitTx's own listing, committed on another connection, included).
// The trigger takes that failure as "listed", line by line, and lets
// any other serialization failure (SSI's carry a detail) through. Each
// line's shared lock is taken outside the subtransaction that may fail,
// so that it is held until the caller commits, as under READ COMMITTED.
var sqlV11Harden = `CREATE OR REPLACE FUNCTION idemgate_tasks_notify(kind text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
	PERFORM pg_catalog.pg_notify('idemgate_tasks'::pg_catalog.text, kind);
	RETURN true;
END $$;
CREATE OR REPLACE FUNCTION idemgate_tasks_notify_cancel(id text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
	PERFORM pg_catalog.pg_notify('idemgate_tasks_cancel'::pg_catalog.text, id);
	RETURN true;
END $$;
CREATE OR REPLACE FUNCTION idemgate_tasks_waiting() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
	line record;
	detail text;
BEGIN
	IF pg_catalog.current_setting('transaction_isolation'::pg_catalog.text) OPERATOR(pg_catalog.=) 'read committed'::pg_catalog.text THEN
		` + waitingInsertV11 + `;
		RETURN NULL;
	END IF;
	BEGIN
		` + waitingInsertV11 + `;
		RETURN NULL;
	EXCEPTION WHEN serialization_failure THEN
		GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
		IF detail IS NOT NULL AND detail OPERATOR(pg_catalog.<>) ''::pg_catalog.text THEN
			RAISE;
		END IF;
	END;
	FOR line IN ` + waitingLinesV11 + ` LOOP
		PERFORM pg_catalog.pg_advisory_xact_lock_shared(8193, ` + lineLockV11("line") + `);
		BEGIN
			INSERT INTO idemgate_waiting_tenants (kind, priority, tenant) VALUES (line.kind, line.priority, line.tenant)
			ON CONFLICT DO NOTHING;
		EXCEPTION WHEN serialization_failure THEN
			GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
			IF detail IS NOT NULL AND detail OPERATOR(pg_catalog.<>) ''::pg_catalog.text THEN
				RAISE;
			END IF;
		END;
	END LOOP;
	RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION idemgate_sweep_waiting(after_kind text, after_priority smallint, after_tenant text,
	batch integer, min_age_us bigint, OUT examined bigint, OUT last_kind text, OUT last_priority smallint, OUT last_tenant text,
	OUT removed bigint) LANGUAGE plpgsql AS $$
DECLARE
	ks text[];
	ps smallint[];
	ts text[];
BEGIN
	removed := 0;
	WITH b AS (
		SELECT w.kind, w.priority, w.tenant, w.listed_at FROM idemgate_waiting_tenants w
		WHERE ROW(w.kind, w.priority, w.tenant) OPERATOR(pg_catalog.>) ROW(after_kind, after_priority, after_tenant)
		ORDER BY w.kind, w.priority, w.tenant
		LIMIT batch
	), e AS (
		SELECT w.kind, w.priority, w.tenant FROM (SELECT * FROM b w
			WHERE w.listed_at OPERATOR(pg_catalog.<=) (pg_catalog.now() OPERATOR(pg_catalog.-)
				(min_age_us::pg_catalog.float8 OPERATOR(pg_catalog.*) '1 microsecond'::pg_catalog.interval))
			AND ` + waitingEmptyV11 + ` OFFSET 0) w
		WHERE pg_catalog.pg_try_advisory_xact_lock(8193, ` + lineLockV11("w") + `)
	)
	SELECT (SELECT pg_catalog.count(*) FROM b), l.kind, l.priority, l.tenant, a.ks, a.ps, a.ts
	INTO examined, last_kind, last_priority, last_tenant, ks, ps, ts
	FROM (SELECT pg_catalog.array_agg(kind) AS ks, pg_catalog.array_agg(priority) AS ps,
		pg_catalog.array_agg(tenant) AS ts FROM e) a
	LEFT JOIN LATERAL (SELECT * FROM b ORDER BY kind DESC, priority DESC, tenant DESC LIMIT 1) l ON true;
	-- Only READ COMMITTED gives the next statement a snapshot newer than
	-- the locks; under another isolation the lines are left for a sweep
	-- that runs under it.
	IF ks IS NULL OR pg_catalog.current_setting('transaction_isolation'::pg_catalog.text)
		OPERATOR(pg_catalog.<>) 'read committed'::pg_catalog.text THEN
		RETURN;
	END IF;
	DELETE FROM idemgate_waiting_tenants w
	USING ROWS FROM (pg_catalog.unnest(ks), pg_catalog.unnest(ps), pg_catalog.unnest(ts)) AS e(kind, priority, tenant)
	WHERE w.kind OPERATOR(pg_catalog.=) e.kind AND w.priority OPERATOR(pg_catalog.=) e.priority
		AND w.tenant OPERATOR(pg_catalog.=) e.tenant AND ` + waitingEmptyV11 + `;
	GET DIAGNOSTICS removed = ROW_COUNT;
END $$;
DO $$
DECLARE
	f text;
	r record;
BEGIN
	FOREACH f IN ARRAY ARRAY['idemgate_tasks_notify(text)', 'idemgate_tasks_notify_cancel(text)', 'idemgate_tasks_waiting()',
		'idemgate_sweep_waiting(text, smallint, text, integer, bigint)'] LOOP
		EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f, pg_catalog.current_schema());
		EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
		FOR r IN SELECT DISTINCT CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
				ELSE pg_catalog.quote_ident(g.rolname::pg_catalog.text) END AS role
			FROM pg_catalog.pg_class c
			CROSS JOIN LATERAL pg_catalog.aclexplode(COALESCE(c.relacl, pg_catalog.acldefault('r'::pg_catalog."char", c.relowner))) a
			LEFT JOIN pg_catalog.pg_roles g ON g.oid OPERATOR(pg_catalog.=) a.grantee
			WHERE c.oid OPERATOR(pg_catalog.=) 'idemgate_tasks'::pg_catalog.regclass
				AND a.privilege_type OPERATOR(pg_catalog.=) ANY ('{INSERT,UPDATE,DELETE}'::pg_catalog.text[]) LOOP
			EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', f, r.role);
		END LOOP;
	END LOOP;
END $$;
-- A line missed by v9's fill (run under REPEATABLE READ or SERIALIZABLE,
-- it could miss a task committed while it waited for its lock) is listed
-- now: the triggers list every task written since.
INSERT INTO idemgate_waiting_tenants (kind, priority, tenant)
SELECT DISTINCT kind, priority, tenant FROM idemgate_tasks
WHERE state IN ('pending', 'retrying') AND (turn IS NULL OR turn >= 0)
ON CONFLICT DO NOTHING`

// The pieces of v11's functions.
const (
	// waitingLinesV11 are the placed waiting lines of the statement's new
	// rows, each once, in key order.
	waitingLinesV11 = `SELECT DISTINCT n.kind, n.priority, n.tenant FROM idemgate_new_tasks n
		WHERE n.state OPERATOR(pg_catalog.=) ANY ('{pending,retrying}'::pg_catalog.text[])
			AND (n.turn IS NULL OR n.turn OPERATOR(pg_catalog.>=) 0) ORDER BY 1, 2, 3`
	// waitingInsertV11 lists the statement's lines, each locked shared
	// (the lateral call) just before its row is inserted.
	waitingInsertV11 = `INSERT INTO idemgate_waiting_tenants (kind, priority, tenant)
		SELECT w.kind, w.priority, w.tenant FROM (` + waitingLinesV11 + `) w
		CROSS JOIN LATERAL pg_catalog.pg_advisory_xact_lock_shared(8193, ` + lineLockV11Expr + `) l
		ON CONFLICT DO NOTHING`
	// waitingEmptyV11 is waitingEmpty, spelled.
	waitingEmptyV11 = `NOT EXISTS (SELECT FROM idemgate_tasks t WHERE t.kind OPERATOR(pg_catalog.=) w.kind
		AND t.priority OPERATOR(pg_catalog.=) w.priority AND t.tenant OPERATOR(pg_catalog.=) w.tenant
		AND t.state OPERATOR(pg_catalog.=) ANY ('{pending,retrying}'::pg_catalog.text[])
		AND (t.turn IS NULL OR t.turn OPERATOR(pg_catalog.>=) 0))`
	// lineLockV11Expr is the second key of line w's lock (v9's, the same
	// value: the hash of "kind/priority/tenant", modulo 64).
	lineLockV11Expr = `pg_catalog.hashtext(w.kind OPERATOR(pg_catalog.||) '/'::pg_catalog.text OPERATOR(pg_catalog.||)
		w.priority::pg_catalog.text OPERATOR(pg_catalog.||) '/'::pg_catalog.text OPERATOR(pg_catalog.||) w.tenant)
		OPERATOR(pg_catalog.&) 63`
)

// lineLockV11 is lineLockV11Expr of the line named alias.
func lineLockV11(alias string) string {
	return strings.ReplaceAll(lineLockV11Expr, "w.", alias+".")
}

// turnOf is the turn of a new task of (kind, priority, tenant), SQL
// expressions all three: the turn after the tenant's last task waiting in
// that line, but never before the line's next turn (the lowest turn of
// its due tasks), and 0 for an empty line. A task not yet due (RunAfter
// ahead, a retry's backoff) keeps the turn it was given, which the line
// may have passed long ago: counted, it would pin the line's next turn
// there, and every newcomer's backlog would run before the tenants
// already waiting. So a tenant's backlog takes turns 0, 1,
// 2, …, and another tenant's first task the next turn to be served:
// claims, which take the lowest turns first, serve the tenants in turn.
// A task submitted for later takes no turn (unplaced, -1) until a claim
// finds it due (dueUnplaced), and is not counted by either lookup.
// Each lookup is one descent of an index (tenant_turn, claim_v8). Two
// concurrent Submits of one tenant may take the same turn: a tenant gains
// at most its concurrency in places, and no lock serializes its Submits.
func turnOf(kind, priority, tenant string) string {
	return `greatest(0,
	(SELECT w.turn + 1 FROM idemgate_tasks w WHERE w.kind = ` + kind + ` AND w.priority = ` + priority + `
		AND w.tenant = ` + tenant + ` AND w.state IN ('pending', 'retrying') AND w.turn >= 0
		ORDER BY w.turn DESC LIMIT 1),
	(SELECT w.turn FROM idemgate_tasks w WHERE w.kind = ` + kind + ` AND w.priority = ` + priority + `
		AND w.state IN ('pending', 'retrying') AND w.turn >= 0 AND w.run_after <= now()
		ORDER BY w.turn NULLS FIRST LIMIT 1))`
}

// unplaced is the turn of a task waiting for its RunAfter, which takes its
// turn when due (v8).
const unplaced = `-1`

// waitingKinds are the kinds with placed waiting tasks, each once, in
// order, found by skipping from one kind to the next on the claim index
// (one descent a kind, never a read of the kind's line). The claim of any
// kind reads each kind's candidates on the claim index (v10: there is no
// index of every kind's waiting tasks). The kinds come from the index,
// not from idemgate_waiting_tenants: a task whose line is missing there
// (written with triggers off, as a data-only restore may) is still
// claimed.
const waitingKinds = `WITH RECURSIVE k AS (
	(SELECT t.kind FROM idemgate_tasks t WHERE t.state IN ('pending', 'retrying') AND ` + placedT + `
		ORDER BY t.kind LIMIT 1)
	UNION ALL
	SELECT (SELECT t.kind FROM idemgate_tasks t WHERE t.kind > k.kind AND t.state IN ('pending', 'retrying') AND ` + placedT + `
		ORDER BY t.kind LIMIT 1)
	FROM k WHERE k.kind IS NOT NULL
) SELECT k.kind FROM k WHERE k.kind IS NOT NULL`

// stillWaitingT is true of a task t that waits, due and placed (as
// runnableDue), spelled for a claim that locks its candidates by primary
// key: the state as NOT IN the other states (the same rows, by the
// table's CHECK), so that the condition implies no partial index's
// predicate and the planner can only fetch the rows by primary key.
// Spelled state IN ('pending', 'retrying'), it implied the claim index's
// predicate, and the generic plan, on the statistics of a table not yet
// analyzed, ANDed a bitmap of that whole index (every waiting task, a
// paused kind's backlog included) with the primary key's: 101,006 rows
// read for a claim of 1 beside a paused kind's 100k tasks, at every claim
// (TestAnyKindClaimBesidePausedBacklogReadsNoBacklog).
const stillWaitingT = `t.state NOT IN ('running', 'uncertain', 'succeeded', 'failed', 'cancelled')
		AND t.run_after <= now() AND (t.turn IS NULL OR t.turn >= 0)`

// placed is true of a task that has its turn (or a task from before v6,
// which has none and goes first): the claim indexes' condition (v8).
const placed = `(turn IS NULL OR turn >= 0)`

// placedT is placed, on t.
const placedT = `(t.turn IS NULL OR t.turn >= 0)`

// newTurn is the turn of a new task due at runAfter (SQL, NULL: now) of
// (kind, priority, tenant): unplaced if it is not due yet, else turnOf.
// The CASE keeps turnOf's lookups from running for a scheduled task.
func newTurn(runAfter, kind, priority, tenant string) string {
	return `CASE WHEN ` + runAfter + ` > now() THEN ` + unplaced + ` ELSE ` + turnOf(kind, priority, tenant) + ` END`
}

// dueUnplaced is the CTE u, which every claim reads first: up to 256
// tasks come due that have no turn yet, in RunAfter order, each with the
// turn it takes now (its tenant's next turns in its line, as Submit would
// give them), read on the scheduled index; almost always none (one index
// descent). The claim's candidates include those of its kinds (unplacedArm),
// so a task is claimed as soon as it is due; those the claim does not take
// get their turn in the same statement (promoted). SKIP LOCKED: claims
// racing place each task once.
var dueUnplaced = `u AS (
	SELECT d.id, d.kind, d.tenant, d.priority,
		l.first + row_number() OVER (PARTITION BY d.kind, d.priority, d.tenant ORDER BY d.run_after, d.id) - 1 AS turn,
		d.run_after
	FROM (SELECT id, kind, tenant, priority, run_after FROM idemgate_tasks
		WHERE state IN ('pending', 'retrying') AND turn = ` + unplaced + ` AND run_after <= now()
		ORDER BY run_after
		LIMIT 256
		FOR UPDATE SKIP LOCKED) d
	CROSS JOIN LATERAL (SELECT ` + turnOf("d.kind", "d.priority", "d.tenant") + ` AS first) l
)`

// promoted is the CTE that gives the tasks of u the claim did not pick
// (picked) their turn.
const promoted = `promoted AS (
	UPDATE idemgate_tasks t SET turn = u.turn
	FROM u WHERE t.id = u.id AND t.id = ANY(ARRAY(SELECT u.id FROM u))
		AND NOT EXISTS (SELECT FROM picked WHERE picked.id = u.id)
)`

// unplacedArm is the candidates among u of the claim's kinds; cond, if not
// empty, is a condition added, on t.
func unplacedArm(cond string) string {
	return `SELECT id, kind, tenant, priority, turn, run_after FROM u t
	WHERE ` + fmt.Sprintf(anyOfKinds, "t.kind") + ` AND ` + notHeld + cond
}

// Submit and reads.
var (
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
	sqlSubmit = submitSQL(false)

	// sqlSubmitWide is sqlSubmit on a schema before v12 (or mid-v12),
	// whose arbiter is v2's index on the key's columns.
	sqlSubmitWide = submitSQL(true)

	// sqlSubmitPlain is Submit while the wide index is not (yet) valid, as
	// during the v2 build: a conflict surfaces as a unique violation whose
	// constraint name tells which index caught it.
	sqlSubmitPlain = `WITH ins AS (
	INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, params, trace,
		run_after, priority, turn)
	VALUES (@tenant, @owner, @kind, @runtime, @network, @key, @fingerprint, @params, @trace,
		greatest(@run_after::timestamptz, now()), @priority,
		` + newTurn("@run_after::timestamptz", "@kind::text", "@priority::smallint", "@tenant::text") + `)
	RETURNING ` + taskColumns + `
)
SELECT *, false AS duplicate FROM ins
WHERE NOT @notify::boolean OR ins.run_after > now() OR idemgate_tasks_notify(ins.kind)`

	// sqlSubmitMany is Submit of a batch, in one statement: the tasks come
	// as one array per column, each key once, sorted by key in Go
	// (@run_afters NULL or past is now()). Rows are inserted in that
	// order, so two batches that share keys wait for each other's keys in
	// the same order and never deadlock. The tasks of one (kind,
	// priority, tenant) take consecutive turns: @lines_of numbers each
	// task's line (from 1, in Go), whose turnOf is looked up once, in an
	// InitPlan; a task is @nths[i] places after its line's. Each item gets one
	// row: the row it inserted (duplicate false) or, only when some key
	// was not inserted, the row that held its key (duplicate true), read
	// on the statement's snapshot; an item whose key is held by a row
	// this snapshot cannot see gets none, and the caller runs it again.
	// Rows come back by key: RETURNING cannot carry the input's position.
	// The statement is written so that its generic plan is chosen (planned
	// once per connection, not at every call: 0.5 ms a batch): the lines
	// are taken from the tasks' arrays by DISTINCT ON, which a custom plan
	// estimates at one a task; and a held key is read by a LATERAL lookup
	// of its one row (LIMIT 1 keeps it an index probe, never a hash join
	// over the table, in any plan).
	// A kind in @notify_kinds with an inserted row that may run now is
	// announced, once.
	sqlSubmitMany = submitManySQL(false)

	// sqlSubmitManyWide is sqlSubmitMany before v12 (see sqlSubmitWide).
	sqlSubmitManyWide = submitManySQL(true)

	// sqlByKey reads a task back by its full key (@key_digest its digest).
	sqlByKey = byKeySQL(false)

	// sqlByKeyWide is sqlByKey before v12.
	sqlByKeyWide = byKeySQL(true)

	// sqlGet scopes the lookup to the caller: anyone else's task is
	// absent. @operator lifts the scope (Operator.Get).
	sqlGet = `SELECT ` + taskColumns + `, false AS duplicate FROM idemgate_tasks
WHERE id = @id::uuid AND (@operator::boolean OR tenant = @tenant AND owner = @owner)`

	// sqlList lists tasks newest first, of @state, @tenant and @kind
	// where they are not empty. For operator tools: it may read much of
	// the table.
	sqlList = `SELECT ` + taskColumns + `, false AS duplicate FROM idemgate_tasks
WHERE (@state::text = '' OR ` + shownState + ` = @state) AND (@tenant::text = '' OR tenant = @tenant)
	AND (@kind::text = '' OR kind = @kind)
ORDER BY created_at DESC, id
LIMIT @limit`

	// sqlRetry puts a failed task back in line on the same row, as an
	// operator's controlled recovery: with its attempts reset (tries, not
	// attempt, the fencing token), a fresh turn in its tenant's line, and
	// what partial results it kept.
	sqlOperatorRetry = `WITH rec AS (
	UPDATE idemgate_tasks t SET state = 'retrying', tries = 0, recoveries = t.recoveries + 1, error = '',
		run_after = now(), finished_at = NULL, updated_at = now(),
		turn = ` + turnOf("t.kind", "t.priority", "t.tenant") + `
	WHERE t.id = @id::uuid AND t.state = 'failed'
	RETURNING ` + tTaskColumns + `
)
SELECT *, false AS duplicate FROM rec WHERE idemgate_tasks_notify(rec.kind)`

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
	// whose running attempt of it (if any) then stops; scoped like sqlGet.
	// A task an attempt holds stays held (state, lease, claim) with the
	// cancellation recorded, until the attempt's worker ends it (see
	// shownState). A finished task, or one already cancelled, is left
	// alone: nothing comes back, and the caller reads it to say why.
	sqlCancel = `WITH can AS (
	UPDATE idemgate_tasks t SET
		state = CASE WHEN ` + heldByAttempt + ` THEN t.state ELSE 'cancelled' END,
		lease_until = CASE WHEN ` + heldByAttempt + ` THEN t.lease_until END,
		locked_by = CASE WHEN ` + heldByAttempt + ` THEN t.locked_by END,
		error = 'cancelled', finished_at = now(), updated_at = now()
	WHERE id = @id::uuid AND (@operator::boolean OR tenant = @tenant AND owner = @owner)
		AND state IN ('pending', 'running', 'retrying', 'uncertain') AND finished_at IS NULL
	RETURNING ` + tTaskColumns + `
)
SELECT *, false AS duplicate FROM can WHERE idemgate_tasks_notify_cancel(can.id)`

	// sqlPrune deletes one batch of tasks that finished more than
	// @older_us ago (and so were submitted before that too); SKIP LOCKED
	// keeps it out of the way of anything touching those rows. The state
	// list is the predicate of the finished-task index.
	sqlPrune = `WITH doomed AS (
	SELECT id FROM idemgate_tasks
	WHERE state IN ('succeeded', 'failed', 'cancelled')
		AND finished_at < now() - @older_us::bigint::float8 * interval '1 microsecond'
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
FROM idemgate_tasks WHERE state = 'uncertain' GROUP BY kind, state
UNION ALL
SELECT kind, '` + statsHolding + `', count(*)::bigint, 0, 0
FROM idemgate_tasks WHERE state = 'running' AND lease_until > now() GROUP BY kind
UNION ALL
SELECT kind, '` + statsHolding + `', count(*)::bigint, 0, 0
FROM idemgate_tasks WHERE state = 'uncertain' AND locked_by IS NOT NULL AND run_after > now() GROUP BY kind`

	// statsHolding marks sqlStats' rows that count the attempts holding
	// their task (the claim's holding predicate, one arm per index: the
	// leased and the uncertain index).
	statsHolding = "holding"
)

// Claims. A claim takes up to @limit tasks in one statement shaped like
// river's: candidates read from an index in claim order with FOR UPDATE
// SKIP LOCKED, then one UPDATE … RETURNING. Runnable tasks are taken by
// priority, highest first, then by turn (tenants in turn, see turnOf),
// then oldest first; uncertain tasks due for a Reconcile oldest first.
// @held are tasks whose earlier attempt still runs in this worker: it
// never runs two attempts of one task.
//
// Kind limits bind the claim: a candidate is taken only while its kind
// has room (not paused, fewer attempts holding a lease than MaxRunning,
// a token for StartsPerSecond) and its tenant too (MaxRunningPerTenant).
// The room is counted from the table itself (attempts whose lease has
// not ended, dead workers' included), so it needs the latest committed
// claims: sqlLockLimitedKinds runs first, in the same transaction, and
// serializes the claims of limited kinds; the claim's own snapshot is
// taken after it. Kinds without limits take no lock.

// sqlLockLimitedKinds takes the advisory locks of the limited or paused
// kinds among @kinds (all when empty), in one order, so that two claims
// never wait for each other crosswise. A lock's keys are (8192,
// hashtext(kind)); migrations use the class 8191. It records the kinds it
// locked in the transaction's setting idemgate.locked_kinds (see
// lockedKinds): limits set between this statement and the claim (a kind
// paused here may have MaxRunning there) give no room to a kind it did
// not lock, so that two claims never count one kind's room at once.
// It also sets claimSettings, JIT off among them: the claim reads a few
// rows, but its estimates (CTEs, window functions) can pass
// jit_above_cost, and compiling it would cost far more than running it.
// limited says whether any of @kinds (all when empty) has limits or is
// paused: while none has, workers claim with claimFreeSQL.
const sqlLockLimitedKinds = `SELECT ` + claimSettings + ` AS settings,
	(SELECT pg_catalog.cardinality(set_config('idemgate.locked_kinds', coalesce(pg_catalog.array_agg(k.kind), '{}')::text, true)::text[])
	FROM (SELECT l.kind, pg_advisory_xact_lock(8192, hashtext(l.kind)) FROM idemgate_kind_limits l
		WHERE ` + hasLimits + `
			AND (pg_catalog.cardinality(coalesce(@kinds::text[], '{}')) = 0 OR l.kind = ANY(@kinds::text[]))
		ORDER BY hashtext(l.kind), l.kind) k) AS locked,
	EXISTS (SELECT FROM idemgate_kind_limits l WHERE ` + hasLimits + `
		AND (pg_catalog.cardinality(coalesce(@kinds::text[], '{}')) = 0 OR l.kind = ANY(@kinds::text[]))) AS limited`

// claimSettings are the settings of a claim's transaction: JIT off (see
// sqlLockLimitedKinds) and the claim's generic plan. A claim's LIMIT is a
// parameter (@limit), which a generic plan estimates at a tenth of the
// rows: beside a backlog of 100k the generic plan looks ten times the
// custom one, Postgres never switches to it, and every claim was planned
// again (2–3 ms a claim at 100k, more than it takes to run; half the
// claim's latency, its growth from the small queue to 100k). The generic
// plan has the custom plan's shape at any backlog (the claim index read
// in order under the limit: TestClaimGenericPlanReadsTheIndex), so the
// claim is planned once per connection. Its UPDATEs find their rows by
// id = ANY(ARRAY(…)) beside the join: by the join alone, the generic
// plan took the picked rows for a tenth of the table and hashed it whole
// (a sequential scan of every task at every claim).
const claimSettings = `set_config('jit', 'off', true) || ' ' || set_config('plan_cache_mode', 'force_generic_plan', true)
	|| ' ' || set_config('enable_seqscan', 'off', true)`

// sqlClaimSettings sets claimSettings in the transaction of a claim of
// kinds without limits, which has no lock statement to carry them.
const sqlClaimSettings = `SELECT ` + claimSettings

// hasLimits is true of a limits row l that limits or pauses its kind.
const hasLimits = `(l.max_running > 0 OR l.max_running_per_tenant > 0 OR l.starts_per_second > 0 OR l.paused)`

// holding is true of a task h whose attempt counts against its kind's
// limits: a running attempt whose lease has not ended (its worker may
// have died: it counts until then), or a Reconcile whose claim has not
// lapsed.
const holding = `(h.state = 'running' AND h.lease_until > now()
		OR h.state = 'uncertain' AND h.locked_by IS NOT NULL AND h.run_after > now())`

// tokensNow is the token bucket of limits row l now: refilled at
// starts_per_second since refilled_at, up to a burst of one second's
// worth (at least one token). Its clock is the statement's start, not
// the transaction's: a claim's transaction may have waited for the lock
// of its kinds, and the bucket refills only until the claim is made.
const tokensNow = `least(greatest(1, l.starts_per_second),
	l.tokens + l.starts_per_second * greatest(0, extract(epoch FROM statement_timestamp() - l.refilled_at))::float8)`

// lockedKinds are the kinds whose locks sqlLockLimitedKinds took in this
// transaction (none outside one).
const lockedKinds = `coalesce(nullif(current_setting('idemgate.locked_kinds', true), ''), '{}')::text[]`

// claimLimits is the CTE lim: the limits of the claim's kinds (%s filters
// l.kind), with room, the attempts the kind may start now (NULL: no
// limit; 0 for a limited kind whose lock the claim does not hold: its
// limits were set after the lock statement read them, and the next
// claim, which SetKindLimits' notification wakes, takes the lock), and
// per_tenant, MaxRunningPerTenant (0: none).
const claimLimits = `lim AS (
	SELECT l.kind, l.max_running_per_tenant AS per_tenant, ` + tokensNow + ` AS tokens,
		CASE WHEN l.paused OR ` + hasLimits + ` AND NOT l.kind = ANY(` + lockedKinds + `) THEN 0 ELSE least(
			CASE WHEN l.max_running > 0 THEN greatest(0, l.max_running
				- (SELECT count(*) FROM idemgate_tasks h WHERE h.kind = l.kind AND ` + holding + `)) END,
			CASE WHEN l.starts_per_second > 0 THEN least(floor(` + tokensNow + `), 2147483647) END)::int END AS room
	FROM idemgate_kind_limits l
	WHERE %s
)`

// claimShape is what differs between claims: the candidate CTEs (ending
// in one named cand, with columns id, kind, tenant, priority, turn,
// run_after), their order, what a due task of a kind is, and the SET list.
type claimShape struct {
	limitKinds string // the kinds of lim: a condition on l.kind
	candidates string
	order      string
	pick       string // the order in which candidates are taken, on ranked
	due        string // a condition on task d
	set        string
}

const (
	runnableOrder = `priority DESC, turn NULLS FIRST, run_after`
	// runnablePick takes a claim's candidates of several kinds: highest
	// priority first, then the kinds in turn (each kind's first
	// candidate, then each one's second, …), then by turn. Kinds' turns
	// are not comparable: a kind whose line is new counts from 0, and by
	// turn alone its backlog would go ahead of an older kind's next task.
	// kind_rank is the candidate's place among its kind's of its priority.
	runnablePick = `priority DESC, kind_rank, turn NULLS FIRST, run_after`
	runnableDue  = `d.state IN ('pending', 'retrying') AND d.run_after <= now() AND (d.turn IS NULL OR d.turn >= 0)`
	notHeld      = `id <> ALL(coalesce(@held::uuid[], '{}'))`
	anyOfKinds   = `(pg_catalog.cardinality(coalesce(@kinds::text[], '{}')) = 0 OR %s = ANY(@kinds::text[]))`
	// noRoom is true of a task t whose kind can start nothing now.
	noRoom = `EXISTS (SELECT FROM lim WHERE lim.kind = t.kind AND lim.room = 0)`
	// tenantCapped is true of a task t whose tenant is at its kind's
	// MaxRunningPerTenant.
	// A scalar subquery, not EXISTS nor = ANY: an anti-join would not keep
	// the candidates' scan in index order, stopping after @limit rows,
	// and a comparison of tenants is estimated from the column's
	// statistics (with one tenant in the table, it would pass every row
	// by): the planner would sort the whole backlog instead.
	tenantCapped = `coalesce((SELECT true FROM capped WHERE capped.kind = t.kind AND capped.tenant = t.tenant), false)`
)

// claimCapped is the CTEs running, the attempts holding a lease of each
// tenant of a kind with MaxRunningPerTenant, and capped, the (kind,
// tenant) pairs at their kind's MaxRunningPerTenant, counted under the
// claim's locks (a few rows: at most the attempts running). The claim's
// room of a candidate's tenant is read from running (a hash join), not
// counted again for each candidate: each count read every attempt of
// the kind on the lease index (1,000 rows a candidate beside 1,000
// capped tenants). The
// candidate scan passes capped tenants' tasks by, so that one tenant's
// backlog waiting on its own limit never fills the claim's window of
// @limit candidates and keeps other tenants from starting.
const claimCapped = `running AS (
	SELECT lim.kind, c.tenant, c.n, lim.per_tenant FROM lim CROSS JOIN LATERAL (
		SELECT h.tenant, count(*) AS n FROM idemgate_tasks h WHERE h.kind = lim.kind AND ` + holding + `
		GROUP BY h.tenant) c
	WHERE lim.per_tenant > 0
), capped AS (
	SELECT kind, tenant FROM running WHERE n >= per_tenant
)`

// claimSQL builds the statement of a claim of this shape. Of the
// candidates, those of a kind past its room or of a tenant past its
// MaxRunningPerTenant are not taken (a kind with no room is not read, nor
// the tasks of a tenant already at its MaxRunningPerTenant; a capped
// tenant's backlog of a higher priority is read past, so it costs a scan
// while it lasts, never a stall); each
// kind that held a due task back comes back as a row in state held,
// with the kind and nothing else, after the claimed tasks. Tokens are
// spent in the same statement. Whether a kind without room has a due
// task is read in claim order, on the claim index: without the order the
// planner may take LIMIT 1 for a cheap sequential scan, and a paused
// kind's tasks written last cost the whole table (3,455 buffers, 91 ms
// beside 150k other rows), under the kind's lock.
func claimSQL(sh claimShape) string {
	return `WITH ` + dueUnplaced + `, ` + fmt.Sprintf(claimLimits, sh.limitKinds) + `, ` + claimCapped + `, ` + sh.candidates + `, ranked AS (
	SELECT c.id, c.kind, c.priority, c.turn, c.run_after,
		row_number() OVER (PARTITION BY c.kind, c.priority ORDER BY ` + sh.order + `) AS kind_rank,
		(lim.room IS NULL OR row_number() OVER (PARTITION BY c.kind ORDER BY ` + sh.order + `) <= lim.room)
		AND (coalesce(lim.per_tenant, 0) = 0 OR row_number() OVER (PARTITION BY c.kind, c.tenant ORDER BY ` + sh.order + `)
			<= lim.per_tenant - coalesce(r.n, 0)) AS ok
	FROM cand c LEFT JOIN lim ON lim.kind = c.kind
		LEFT JOIN running r ON r.kind = c.kind AND r.tenant = c.tenant
), picked AS (
	SELECT id, turn FROM ranked WHERE ok ORDER BY ` + sh.pick + ` LIMIT @limit
), ` + promoted + `, claimed AS (
	UPDATE idemgate_tasks t SET ` + sh.set + `, turn = picked.turn
	FROM picked WHERE t.id = picked.id AND t.id = ANY(ARRAY(SELECT picked.id FROM picked))
	RETURNING ` + tTaskColumns + `
), spent AS (
	UPDATE idemgate_kind_limits l SET tokens = lim.tokens - c.n, refilled_at = statement_timestamp()
	FROM (SELECT kind, count(*) AS n FROM claimed GROUP BY kind) c JOIN lim ON lim.kind = c.kind
	WHERE l.kind = c.kind AND l.starts_per_second > 0
)
SELECT *, false AS duplicate FROM claimed
UNION ALL
SELECT '', '', '', h.kind, '', '', '', '', NULL::jsonb, '', '` + string(stateHeld) + `', 0, 0, '[]'::jsonb, '',
	now(), 0::smallint, now(), now(), false
FROM (SELECT kind FROM ranked WHERE NOT ok
	UNION SELECT lim.kind FROM lim WHERE lim.room = 0
		AND (SELECT true FROM idemgate_tasks d WHERE d.kind = lim.kind AND ` + sh.due + `
			ORDER BY ` + sh.order + ` LIMIT 1)) h`
}

// claimRunnableSQL is the claim of runnable tasks of kinds (all when
// none), kind limits applied. Each kind that can be written as a literal
// is read by CTEs of its own that name it, so that the planner, which
// knows how common each kind is, never walks the index of all runnable
// tasks past another kind's backlog (with a parameter, a generic plan
// may), and so that a kind with MaxRunningPerTenant passes its capped
// tenants by without reading their backlog (perTenantCandidates). Kinds
// that cannot be literals, and every kind when kinds is empty, are read
// kind by kind on the claim index (waitingKinds): a kind with no room is
// not read, but a capped tenant's backlog is read past.
func claimRunnableSQL(kinds []string) string {
	kinds = distinctKinds(kinds)
	sh := claimShape{order: runnableOrder, pick: runnablePick, due: runnableDue, set: claimSet}
	if len(kinds) == 0 || slices.ContainsFunc(kinds, func(k string) bool { return !literalKind(k) }) {
		sh.limitKinds, sh.candidates = runnableCandidates(kinds, `
		AND NOT EXISTS (SELECT FROM lim WHERE lim.kind = %s AND lim.room = 0)
		AND NOT `+tenantCapped)
		return claimSQL(sh)
	}
	var b strings.Builder
	quoted := make([]string, len(kinds))
	for i, kind := range kinds {
		quoted[i] = "'" + kind + "'"
		b.WriteString(perTenantCandidates(i, quoted[i]))
	}
	b.WriteString("cand AS (")
	for i := range kinds {
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		fmt.Fprintf(&b, "SELECT * FROM k%d UNION ALL SELECT * FROM l%d", i, i)
	}
	b.WriteString(" UNION ALL " + unplacedArm(`
		AND NOT EXISTS (SELECT FROM lim WHERE lim.kind = t.kind AND lim.room = 0)
		AND NOT `+tenantCapped) + ")")
	sh.limitKinds, sh.candidates = "l.kind IN ("+strings.Join(quoted, ", ")+")", b.String()
	return claimSQL(sh)
}

// perTenantCandidates are the CTEs that read the candidates of kind
// number i, the literal q, in claim order: k<i> while the kind has no
// MaxRunningPerTenant, l<i> while it has. A claim of a kind with
// MaxRunningPerTenant reads without locking a window s<i> of the kind's
// line: @limit twice, plus one row for each capped tenant of the kind,
// whose tasks are then passed by. When the window is full and holds
// fewer than @limit tasks of tenants within their limit (every tenant
// with work, or nearly, is capped), the claim walks the kind's lines in
// idemgate_waiting_tenants instead (w<i>: highest priority first, then by
// name, capped tenants passed by in a hash of them, a hundred or more
// lines to a page), taking the next due task of each tenant that is not
// capped (f<i>: one descent of the tenant_turn index a tenant), until it
// has @limit. So a claim reads what it takes plus a short row for each
// tenant it passes by, never their backlog. l<i>
// locks the @limit best of both, in claim order, rereading each row's
// state on its latest version (SKIP LOCKED: a row another statement
// holds is left). A tenant found by the walk gives as many tasks as its
// limit has room for, lowest turns first (read on the tenant_turn index, whose order puts a task
// from before v6, without a turn, after the tenant's others).
func perTenantCandidates(i int, q string) string {
	waiting := `kind = ` + q + ` AND state IN ('pending', 'retrying')`
	due := waiting + ` AND run_after <= now() AND ` + placed + ` AND ` + notHeld
	// A hashed subplan: each row is looked up in a hash of the capped
	// tenants, not compared with every one of them.
	capped := func(tenant string) string {
		return tenant + ` IN (SELECT capped.tenant FROM capped WHERE capped.kind = ` + q + `)`
	}
	window := `(2 * @limit + (SELECT count(*) FROM capped WHERE capped.kind = ` + q + `))`
	r := strings.NewReplacer("%i", fmt.Sprint(i), "%q", q, "%waiting", waiting, "%due", due, "%order", runnableOrder,
		"%window", window, "%notHeld", notHeld, "%stillWaiting", stillWaitingT, "%cappedS", capped("s.tenant"), "%cappedW", capped("w.tenant"))
	return r.Replace(`k%i AS (
	SELECT id, kind, tenant, priority, turn, run_after FROM idemgate_tasks t
	WHERE %due
		AND NOT EXISTS (SELECT FROM lim WHERE lim.kind = %q AND (lim.room = 0 OR lim.per_tenant > 0))
	ORDER BY %order
	LIMIT @limit
	FOR UPDATE SKIP LOCKED
), s%i AS (
	SELECT id, tenant, priority, turn, run_after FROM idemgate_tasks t
	WHERE %due
		AND EXISTS (SELECT FROM lim WHERE lim.kind = %q AND lim.room IS DISTINCT FROM 0 AND lim.per_tenant > 0)
	ORDER BY %order
	LIMIT %window
), w%i AS (
	SELECT w.priority, w.tenant FROM idemgate_waiting_tenants w
	WHERE w.kind = %q
		AND (SELECT count(*) FROM s%i) >= %window
		AND (SELECT count(*) FROM s%i s WHERE NOT %cappedS) < @limit
		AND NOT %cappedW
	ORDER BY w.priority DESC, w.tenant DESC
), f%i AS (
	SELECT d.* FROM w%i w CROSS JOIN LATERAL (
		SELECT id, tenant, priority, turn, run_after FROM idemgate_tasks t
		WHERE %due AND t.priority = w.priority AND t.tenant = w.tenant
		ORDER BY turn
		LIMIT greatest(1, (SELECT lim.per_tenant FROM lim WHERE lim.kind = %q)
			- coalesce((SELECT r.n FROM running r WHERE r.kind = %q AND r.tenant = w.tenant), 0))) d
	LIMIT @limit
), l%i AS (
	SELECT id, kind, tenant, priority, turn, run_after FROM idemgate_tasks t
	WHERE id = ANY(ARRAY(SELECT u.id FROM (SELECT * FROM s%i s WHERE NOT %cappedS UNION SELECT * FROM f%i) u
			ORDER BY %order LIMIT @limit))
		AND kind = %q AND %stillWaiting AND %notHeld
	FOR UPDATE SKIP LOCKED
), `)
}

// claimFreeSQL is the claim of runnable tasks of kinds while none of them
// has limits: river's shape, one statement, no lock, no count. A guard
// keeps it honest: should a kind have limits by the time it runs (its
// snapshot is taken after SetKindLimits returned), it claims nothing. The
// worker learns of the limits from SetKindLimits' notification, or at a
// poll (at most once a second, a poll's claim is a limited one,
// claimRunnableSQL), and claims with limits from then on.
func claimFreeSQL(kinds []string) string {
	limitKinds, candidates := runnableCandidates(kinds, "")
	return `WITH ` + dueUnplaced + `, ` + candidates + `, picked AS (
	SELECT id, turn FROM (SELECT *, row_number() OVER (PARTITION BY kind, priority ORDER BY ` + runnableOrder + `) AS kind_rank
		FROM cand) c
	WHERE NOT EXISTS (SELECT FROM idemgate_kind_limits l WHERE ` + limitKinds + ` AND ` + hasLimits + `)
	ORDER BY ` + runnablePick + `
	LIMIT @limit
), ` + promoted + `
UPDATE idemgate_tasks t SET ` + claimSet + `, turn = picked.turn
FROM picked WHERE t.id = picked.id AND t.id = ANY(ARRAY(SELECT picked.id FROM picked))
RETURNING ` + tTaskColumns + `, false AS duplicate`
}

// runnableCandidates returns the condition on l.kind that selects the
// limits of kinds, and the CTEs that read their runnable candidates in
// claim order, ending in cand. noRoom, if not empty, is a condition added
// to each read, with %s for the kind.
func runnableCandidates(kinds []string, noRoom string) (limitKinds, candidates string) {
	kinds = distinctKinds(kinds)
	if len(kinds) == 0 || slices.ContainsFunc(kinds, func(k string) bool { return !literalKind(k) }) {
		// Formatted with k.kind, noRoom's test of the kind's room is a
		// condition on the lateral's parameter alone: a kind without room
		// is not read.
		kindRoom := noRoom
		if noRoom != "" {
			noRoom, kindRoom = fmt.Sprintf(noRoom, "t.kind"), fmt.Sprintf(noRoom, "k.kind")
		}
		// wk is the kinds the claim serves that have waiting tasks. With
		// one of them, its line is read and locked in one scan (c1), as
		// the claim of a named kind reads it. With several, each kind's
		// line is read without locks (c0w), twice the batch of it, and
		// only the @limit best of them, kinds in turn, are locked (c0),
		// rereading each row's state (SKIP LOCKED: a row another claim
		// holds is left, and the next in order taken; the window's second
		// half is for a claim racing this one, which reads the same
		// heads). Locked in each kind's read, a claim of 1 beside 200
		// kinds locked 200 rows (one WAL record each) and hid them from
		// every other claim while it ran; read twice and locked by
		// primary key, the claim of a lone kind cost the server more a
		// task than one locking scan (riverbench's drain rows).
		line := `SELECT id, kind, tenant, priority, turn, run_after FROM idemgate_tasks t
		WHERE t.kind = k.kind AND state IN ('pending', 'retrying') AND run_after <= now() AND ` + placed + `
			AND ` + notHeld + kindRoom + `
		ORDER BY ` + runnableOrder
		return fmt.Sprintf(anyOfKinds, "l.kind"), `wk AS (
	SELECT k.kind FROM (` + waitingKinds + `) k WHERE ` + fmt.Sprintf(anyOfKinds, "k.kind") + `
), c1 AS (
	SELECT c.* FROM wk k CROSS JOIN LATERAL (` + line + `
		LIMIT @limit
		FOR UPDATE SKIP LOCKED) c
	WHERE (SELECT count(*) FROM wk) = 1
), c0w AS (
	SELECT c.*, row_number() OVER (PARTITION BY c.kind, c.priority ORDER BY c.turn NULLS FIRST, c.run_after) AS kind_rank
	FROM wk k CROSS JOIN LATERAL (` + line + `
		LIMIT 2 * @limit) c
	WHERE (SELECT count(*) FROM wk) > 1
), c0 AS (
	SELECT t.id, t.kind, t.tenant, t.priority, t.turn, t.run_after
	FROM c0w w JOIN idemgate_tasks t ON t.id = w.id
	WHERE t.id = ANY(ARRAY(SELECT c0w.id FROM c0w)) AND ` + stillWaitingT + `
	ORDER BY w.priority DESC, w.kind_rank, w.turn NULLS FIRST, w.run_after
	LIMIT @limit
	FOR UPDATE OF t SKIP LOCKED
), cand AS (SELECT * FROM c1 UNION ALL SELECT * FROM c0 UNION ALL ` + unplacedArm(noRoom) + `)`
	}
	var b strings.Builder
	quoted := make([]string, len(kinds))
	for i, kind := range kinds {
		quoted[i] = "'" + kind + "'"
		cond := ""
		if noRoom != "" {
			cond = fmt.Sprintf(noRoom, quoted[i])
		}
		fmt.Fprintf(&b, `k%d AS (
	SELECT id, kind, tenant, priority, turn, run_after FROM idemgate_tasks t
	WHERE kind = %s AND state IN ('pending', 'retrying') AND run_after <= now() AND %s AND %s%s
	ORDER BY %s
	LIMIT @limit
	FOR UPDATE SKIP LOCKED
), `, i, quoted[i], placed, notHeld, cond, runnableOrder)
	}
	b.WriteString("cand AS (")
	for i := range kinds {
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		fmt.Fprintf(&b, "SELECT * FROM k%d", i)
	}
	if noRoom != "" {
		noRoom = fmt.Sprintf(noRoom, "t.kind")
	}
	b.WriteString(" UNION ALL " + unplacedArm(noRoom) + ")")
	return "l.kind IN (" + strings.Join(quoted, ", ") + ")", b.String()
}

// distinctKinds is kinds with each kind once, in the order of first
// appearance. A kind named twice would have its candidates read twice in
// one statement: each copy took a place of the kind's room (MaxRunning 3
// claimed 2 tasks).
func distinctKinds(kinds []string) []string {
	var out []string
	for _, k := range kinds {
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

// sqlClaimUncertain takes uncertain tasks of @kinds (all when empty) due
// for reconciliation. The state stays uncertain; run_after moves past the
// lease so no other worker reconciles the task meanwhile, and attempt is
// the fence. A Reconcile counts against its kind's limits like an attempt.
var sqlClaimUncertain = claimSQL(claimShape{
	limitKinds: fmt.Sprintf(anyOfKinds, "l.kind"),
	candidates: `cand AS (
	SELECT id, kind, tenant, priority, turn, run_after FROM idemgate_tasks t
	WHERE state = 'uncertain' AND run_after <= now() AND ` + fmt.Sprintf(anyOfKinds, "kind") + `
		AND ` + notHeld + ` AND NOT ` + noRoom + ` AND NOT ` + tenantCapped + `
	ORDER BY run_after
	LIMIT @limit
	FOR UPDATE SKIP LOCKED
)`,
	order: "run_after",
	pick:  "run_after",
	due:   `d.state = 'uncertain' AND d.run_after <= now()`,
	set: `attempt = t.attempt + 1,
	run_after = now() + @lease_us::bigint::float8 * interval '1 microsecond', locked_by = @worker,
	updated_at = now()`,
})

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

// Sweeping idemgate_waiting_tenants (see sqlV9Waiting): a line whose
// tasks have all started or ended keeps its row until a sweep removes it.
// The sweep (the function idemgate_sweep_waiting, v9) reads a batch of
// lines after a given one, in key order, locks (exclusive, try: never
// waiting) those that look empty on its snapshot, then, in a statement of
// its own and so on a newer snapshot, deletes those still empty. A writer
// whose task is not yet committed holds its line's shared lock (the line
// is skipped) or takes it after the sweep, and adds the row again. It is
// one call, committed at once: a sweep's locks are never held while its
// client is away (a paused process, a cut network would hold up every
// writer of those lines until the server ended the transaction).
const (
	// waitingEmpty is true of a line w without a placed waiting task.
	waitingEmpty = `NOT EXISTS (SELECT FROM idemgate_tasks t WHERE t.kind = w.kind AND t.priority = w.priority
		AND t.tenant = w.tenant AND t.state IN ('pending', 'retrying') AND (t.turn IS NULL OR t.turn >= 0))`

	// sqlListLine lists the line of a task that SubmitTx is about to
	// write in the caller's transaction, committed at once (on the
	// store's pool), so that the transaction's trigger finds the line
	// listed: a transaction that listed a new line itself would hold the
	// row until it commits, and another transaction listing the same line
	// would wait for it (or, each holding a line the other wants,
	// deadlock). The sweep leaves a line listed in the last minute
	// (sweepMinAge), so
	// the caller's transaction has that long to write its task before the
	// line may be swept; a line is stamped again at most every 30 s.
	// A line stamped in the last 30 s is left alone without a write: the
	// upsert alone would lock its row, take a transaction ID and flush a
	// commit at every SubmitTx.
	sqlListLine = `INSERT INTO idemgate_waiting_tenants AS w (kind, priority, tenant)
SELECT @kind, @priority, @tenant
WHERE NOT EXISTS (SELECT FROM idemgate_waiting_tenants l WHERE l.kind = @kind AND l.priority = @priority
	AND l.tenant = @tenant AND l.listed_at >= now() - interval '30 seconds')
ON CONFLICT (kind, priority, tenant) DO UPDATE SET listed_at = now()
	WHERE w.listed_at < now() - interval '30 seconds'`

	// sqlSweepWaiting sweeps a batch of lines after @kind, @priority,
	// @tenant, leaving those listed less than @min_age_us ago, and returns how many it examined, the last one (where the
	// next sweep starts) and how many it removed.
	sqlSweepWaiting = `SELECT examined, coalesce(last_kind, '') AS last_kind, coalesce(last_priority, 0) AS last_priority,
	coalesce(last_tenant, '') AS last_tenant, removed
FROM idemgate_sweep_waiting(@kind::text, @priority::smallint, @tenant::text, @limit::int, @min_age_us::bigint)`

	// sqlUnlistedLines reads the lines with waiting tasks after @kind,
	// @priority, @tenant, in key order, up to @limit, skipping from one
	// line to the next on the tenant_turn index (one descent a line, never
	// a read of its backlog), and says of each whether it has a placed
	// waiting task that idemgate_waiting_tenants does not list: a task
	// written with triggers off (session_replication_role = replica, as a
	// data-only restore or a promoted logical replica writes it). The
	// placed task is looked up by two descents (turn >= 0, then turn IS
	// NULL), so a line's scheduled tasks (turn -1), which come first in
	// the index, are never read through.
	sqlUnlistedLines = `WITH RECURSIVE l AS (
	(SELECT t.kind, t.priority, t.tenant FROM idemgate_tasks t
	WHERE t.state IN ('pending', 'retrying')
		AND (t.kind, t.priority, t.tenant) > (@kind::text, @priority::smallint, @tenant::text)
	ORDER BY t.kind, t.priority, t.tenant
	LIMIT 1)
	UNION ALL
	SELECT n.kind, n.priority, n.tenant FROM l CROSS JOIN LATERAL (
		SELECT t.kind, t.priority, t.tenant FROM idemgate_tasks t
		WHERE t.state IN ('pending', 'retrying') AND (t.kind, t.priority, t.tenant) > (l.kind, l.priority, l.tenant)
		ORDER BY t.kind, t.priority, t.tenant
		LIMIT 1) n
)
SELECT b.kind, b.priority, b.tenant,
	NOT EXISTS (SELECT FROM idemgate_waiting_tenants w
		WHERE w.kind = b.kind AND w.priority = b.priority AND w.tenant = b.tenant)
	AND (EXISTS (SELECT FROM idemgate_tasks p WHERE p.kind = b.kind AND p.priority = b.priority
			AND p.tenant = b.tenant AND p.state IN ('pending', 'retrying') AND p.turn >= 0)
		OR EXISTS (SELECT FROM idemgate_tasks p WHERE p.kind = b.kind AND p.priority = b.priority
			AND p.tenant = b.tenant AND p.state IN ('pending', 'retrying') AND p.turn IS NULL)) AS unlisted
FROM (SELECT * FROM l LIMIT @limit) b`

	// sqlListUnlisted lists one line that sqlUnlistedLines found
	// unlisted. One line a statement, committed at once: it never holds a
	// line's new row while it waits for another's, so it cannot deadlock
	// with a transaction listing lines in another order. No advisory lock:
	// the line's task is committed, so a sweep keeps the line.
	sqlListUnlisted = `INSERT INTO idemgate_waiting_tenants (kind, priority, tenant)
VALUES (@kind, @priority, @tenant)
ON CONFLICT DO NOTHING`
)

// Kind limits.
const (
	// sqlKindLimits reads the limits of @kind; no row: none were set.
	sqlKindLimits = `SELECT max_running, max_running_per_tenant, starts_per_second, paused
FROM idemgate_kind_limits WHERE kind = @kind`

	// sqlAllKindLimits reads the limits of every kind that has some.
	sqlAllKindLimits = `SELECT kind, max_running, max_running_per_tenant, starts_per_second, paused
FROM idemgate_kind_limits
WHERE max_running > 0 OR max_running_per_tenant > 0 OR starts_per_second > 0 OR paused`

	// sqlLockKindLimits locks the limits row of @kind, adding one without
	// limits if there is none (a new row's bucket is filled when limits
	// are set), and reads it. A concurrent insert or update of the row is
	// waited for, and its result read.
	sqlLockKindLimits = `INSERT INTO idemgate_kind_limits AS l (kind) VALUES (@kind)
ON CONFLICT (kind) DO UPDATE SET updated_at = l.updated_at
RETURNING max_running, max_running_per_tenant, starts_per_second, paused`

	// sqlSetKindLimits stores the limits of @kind and tells the workers.
	// The token bucket keeps what it holds (refilled to now, at most the
	// new burst), so that setting limits again gives no extra burst; a new
	// bucket starts full.
	sqlSetKindLimits = `WITH set AS (
INSERT INTO idemgate_kind_limits AS l
	(kind, max_running, max_running_per_tenant, starts_per_second, paused, tokens, refilled_at, updated_at)
VALUES (@kind, @max_running, @max_running_per_tenant, @starts_per_second, @paused,
	greatest(1, @starts_per_second::float8), statement_timestamp(), now())
ON CONFLICT (kind) DO UPDATE SET max_running = EXCLUDED.max_running,
	max_running_per_tenant = EXCLUDED.max_running_per_tenant, starts_per_second = EXCLUDED.starts_per_second,
	paused = EXCLUDED.paused, refilled_at = statement_timestamp(), updated_at = now(),
	tokens = CASE WHEN l.starts_per_second > 0 THEN least(greatest(1, EXCLUDED.starts_per_second), ` + tokensNow + `)
		ELSE greatest(1, EXCLUDED.starts_per_second) END
RETURNING kind
)
SELECT pg_notify('` + limitsChannel + `', kind) FROM set`
)

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
	lease_until = now() + @lease_us::bigint::float8 * interval '1 microsecond', locked_by = @worker,
	lost = CASE WHEN t.kind = ANY(@uncertain_kinds::text[]) THEN 'uncertain' ELSE 'retry' END,
	updated_at = now()`

	// sqlFinishBatch ends many running tasks, each succeeded or failed,
	// with its results and error: the hot path of a busy worker, one
	// statement per batch. Each row is fenced like a single transition.
	// A task cancelled while its attempt ran ends cancelled, its results
	// and error as Cancel left them. Rows are locked in the order of
	// their IDs, as the heartbeat locks them: the two run at once on the
	// same rows, and locked in two orders they could deadlock.
	sqlFinishBatch = `WITH x AS (
	SELECT * FROM unnest(@ids::text[], @attempts::int[], @states::text[], @results::jsonb[], @errors::text[])
		AS x(id, attempt, state, results, error)
), locked AS MATERIALIZED (
	SELECT t.id FROM idemgate_tasks t JOIN x ON t.id = x.id::uuid AND t.attempt = x.attempt
	WHERE t.state = 'running'
	ORDER BY t.id
	FOR UPDATE OF t
)
UPDATE idemgate_tasks t SET
	state = CASE WHEN t.finished_at IS NOT NULL THEN 'cancelled' ELSE x.state END,
	results = CASE WHEN t.finished_at IS NOT NULL THEN t.results ELSE x.results END,
	error = CASE WHEN t.finished_at IS NOT NULL THEN t.error ELSE x.error END,
	lease_until = NULL, locked_by = NULL, finished_at = coalesce(t.finished_at, now()), updated_at = now()
FROM x JOIN locked ON locked.id = x.id::uuid
WHERE t.id = locked.id AND t.attempt = x.attempt AND t.state = 'running'
RETURNING t.id::text AS id, t.state`

	// sqlFinish ends a task: succeeded or failed (@to), with results and
	// error; cancelled, as Cancel left it, if it was cancelled meanwhile.
	sqlFinish = `UPDATE idemgate_tasks SET
	state = CASE WHEN finished_at IS NOT NULL THEN 'cancelled' ELSE @to::text END,
	results = CASE WHEN finished_at IS NOT NULL THEN results ELSE @results::jsonb END,
	error = CASE WHEN finished_at IS NOT NULL THEN error ELSE @error::text END,
	lease_until = NULL, locked_by = NULL, finished_at = coalesce(finished_at, now()), updated_at = now()
WHERE id = @id::uuid AND attempt = @attempt AND state = @from
RETURNING state`

	// sqlEndCancelled ends a task cancelled while its attempt ran, once
	// the attempt stopped.
	sqlEndCancelled = `UPDATE idemgate_tasks SET state = 'cancelled', lease_until = NULL, locked_by = NULL,
	updated_at = now()
WHERE id = @id::uuid AND attempt = @attempt AND state = @from AND finished_at IS NOT NULL
RETURNING state`

	// sqlUncertain parks a task until a reconcile check in @after_us (or
	// ends it cancelled, if it was cancelled meanwhile).
	sqlUncertain = `UPDATE idemgate_tasks SET
	state = CASE WHEN finished_at IS NOT NULL THEN 'cancelled' ELSE 'uncertain' END,
	error = CASE WHEN finished_at IS NOT NULL THEN error ELSE @error::text END,
	run_after = now() + @after_us::bigint::float8 * interval '1 microsecond',
	lease_until = NULL, locked_by = NULL, updated_at = now()
WHERE id = @id::uuid AND attempt = @attempt AND state = @from
RETURNING state`

	// backoff is the delay before try number tries + 1, in µs:
	// min(@backoff_max_us, @backoff_base_us·2^(tries−1)), less a random
	// jitter of up to @jitter of it.
	backoff = `least(@backoff_max_us::float8, @backoff_base_us::float8 * power(2::float8, least(greatest(tries - 1, 0), 40)::float8))
	* (1 - @jitter::float8 * random())`

	// tBackoff is backoff for the alias t.
	tBackoff = `least(@backoff_max_us::float8, @backoff_base_us::float8 * power(2::float8, least(greatest(t.tries - 1, 0), 40)::float8))
	* (1 - @jitter::float8 * random())`

	// sqlRetry requeues a task after @after_us, or after the backoff when
	// @after_us < 0; past @max_attempts tries it fails instead (and a
	// task cancelled meanwhile ends cancelled).
	sqlRetry = `UPDATE idemgate_tasks SET
	state = CASE WHEN finished_at IS NOT NULL THEN 'cancelled'
		WHEN tries >= @max_attempts::int THEN 'failed' ELSE 'retrying' END,
	error = CASE WHEN finished_at IS NOT NULL THEN error
		WHEN tries >= @max_attempts::int THEN 'gave up after ' || tries::text || ' attempts: ' || @error::text
		ELSE @error::text END,
	run_after = now() + (CASE WHEN @after_us::bigint >= 0 THEN @after_us::bigint::float8
		ELSE ` + backoff + ` END) * interval '1 microsecond',
	finished_at = CASE WHEN finished_at IS NOT NULL THEN finished_at WHEN tries >= @max_attempts::int THEN now() END,
	lease_until = NULL, locked_by = NULL, updated_at = now()
WHERE id = @id::uuid AND attempt = @attempt AND state = @from
RETURNING state`

	// sqlRelease hands a task back at shutdown, by its kind's policy: to
	// run again at once, or, when an upstream call may have happened, as
	// uncertain for a reconcile check in @reconcile_us. The attempt
	// counts, like an expired lease: a handler that never finishes within
	// the shutdown deadline would otherwise come back at every restart for
	// ever. Past @max_attempts tries the task fails instead; a task
	// cancelled meanwhile ends cancelled. Only a requeued task is
	// announced.
	sqlRelease = `WITH rel AS (
	UPDATE idemgate_tasks SET
		state = CASE WHEN finished_at IS NOT NULL THEN 'cancelled' WHEN lost = 'uncertain' THEN 'uncertain'
			WHEN tries >= @max_attempts::int THEN 'failed' ELSE 'retrying' END,
		error = CASE WHEN finished_at IS NOT NULL THEN error
			WHEN lost = 'uncertain' THEN 'released at shutdown on attempt ' || tries::text
				|| ': the upstream outcome is unknown'
			WHEN tries >= @max_attempts::int THEN 'released at shutdown on attempt ' || tries::text || ' of '
				|| @max_attempts::int::text || ': the handler did not finish in time'
			ELSE error END,
		finished_at = CASE WHEN finished_at IS NOT NULL THEN finished_at
			WHEN lost <> 'uncertain' AND tries >= @max_attempts::int THEN now() END,
		run_after = CASE WHEN lost = 'uncertain' THEN now() + @reconcile_us::bigint::float8 * interval '1 microsecond'
			ELSE now() END,
		lease_until = NULL, locked_by = NULL, updated_at = now()
	WHERE id = @id::uuid AND attempt = @attempt AND state = 'running'
	RETURNING kind, state
)
SELECT state FROM rel WHERE CASE WHEN rel.state = 'retrying' THEN idemgate_tasks_notify(rel.kind) ELSE true END`

	// sqlHeartbeat extends the leases of every task a worker holds and
	// returns those it still holds, and whether each was cancelled (its
	// attempt must stop; the lease is kept until it has). Rows are locked
	// in the order of their IDs, as sqlFinishBatch locks them.
	sqlHeartbeat = `WITH locked AS MATERIALIZED (
	SELECT t.id FROM idemgate_tasks t
	JOIN unnest(@ids::text[], @attempts::int[]) AS x(id, attempt) ON t.id = x.id::uuid AND t.attempt = x.attempt
	WHERE t.state = 'running'
	ORDER BY t.id
	FOR UPDATE OF t
)
UPDATE idemgate_tasks t
SET lease_until = now() + @lease_us::bigint::float8 * interval '1 microsecond'
FROM locked WHERE t.id = locked.id
RETURNING t.id::text AS id, t.attempt, t.finished_at IS NOT NULL AS cancelled`

	// sqlCancelledOf returns which of @ids (tasks whose Reconcile runs)
	// were cancelled: a Reconcile has no heartbeat, and the notification
	// may have been missed.
	sqlCancelledOf = `SELECT id::text FROM idemgate_tasks
WHERE id = ANY(@ids::uuid[]) AND state = 'uncertain' AND finished_at IS NOT NULL`

	// sqlRescue takes back tasks whose lease ran out (their worker died,
	// hung or was cut off) by each row's lost-attempt policy: uncertain,
	// for a reconcile check in @reconcile_us; or requeued with backoff
	// and jitter, failed past @max_attempts tries.
	//
	// A task cancelled while its attempt held it ends cancelled once the
	// attempt's lease (or, for a Reconcile, its claim) has ended: its
	// worker died before it wrote the end.
	sqlRescue = `WITH lapsed AS (
	SELECT id FROM idemgate_tasks
	WHERE state = 'running' AND lease_until < now()
	ORDER BY lease_until
	LIMIT @limit
	FOR UPDATE SKIP LOCKED
), unclaimed AS (
	SELECT id FROM idemgate_tasks
	WHERE state = 'uncertain' AND run_after <= now() AND finished_at IS NOT NULL
	LIMIT @limit
	FOR UPDATE SKIP LOCKED
), expired AS (
	SELECT id FROM lapsed UNION ALL SELECT id FROM unclaimed
)
UPDATE idemgate_tasks t SET
	state = CASE WHEN t.finished_at IS NOT NULL THEN 'cancelled' WHEN t.lost = 'uncertain' THEN 'uncertain'
		WHEN t.tries >= @max_attempts::int THEN 'failed' ELSE 'retrying' END,
	error = CASE WHEN t.finished_at IS NOT NULL THEN t.error
		WHEN t.lost = 'uncertain' THEN 'lease expired on attempt ' || t.tries::text
			|| ': the upstream outcome is unknown'
		WHEN t.tries >= @max_attempts::int THEN 'lease expired on attempt ' || t.tries::text || ' of ' || @max_attempts::int::text
		ELSE 'lease expired' END,
	run_after = now() + (CASE WHEN t.lost = 'uncertain' THEN @reconcile_us::bigint::float8
		ELSE ` + tBackoff + ` END) * interval '1 microsecond',
	finished_at = CASE WHEN t.finished_at IS NOT NULL THEN t.finished_at
		WHEN t.lost <> 'uncertain' AND t.tries >= @max_attempts::int THEN now() END,
	lease_until = NULL, locked_by = NULL, updated_at = now()
FROM expired WHERE t.id = expired.id
RETURNING t.id::text AS id, t.kind, t.attempt, t.state`
)

// submitSQL is sqlSubmit on the digest's arbiter or, if onColumns, on the
// columns' (a schema before v12, which may have no key_digest).
func submitSQL(onColumns bool) string {
	digestCol, digestArg, conflict, held := `, key_digest`, `, @key_digest`, conflictOnDigest, `key_digest = @key_digest AND `
	if onColumns {
		digestCol, digestArg, conflict, held = ``, ``, conflictOnColumns, ``
	}
	return `WITH ins AS (
	INSERT INTO idemgate_tasks AS t
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, params, trace,
		run_after, priority, turn` + digestCol + `)
	VALUES (@tenant, @owner, @kind, @runtime, @network, @key, @fingerprint, @params, @trace,
		greatest(@run_after::timestamptz, now()), @priority,
		` + newTurn("@run_after::timestamptz", "@kind::text", "@priority::smallint", "@tenant::text") + digestArg + `)
	` + conflict + `
	RETURNING ` + tTaskColumns + `
)
SELECT *, false AS duplicate FROM ins
WHERE NOT @notify::boolean OR ins.run_after > now() OR idemgate_tasks_notify(ins.kind)
UNION ALL
SELECT ` + taskColumns + `, true AS duplicate FROM idemgate_tasks
WHERE ` + held + `tenant = @tenant AND idempotency_key = @key AND runtime = @runtime AND network = @network
	AND NOT EXISTS (SELECT FROM ins)`
}

// byKeySQL is sqlByKey on the digest's index or, if onColumns, on the
// columns'.
func byKeySQL(onColumns bool) string {
	held := `key_digest = @key_digest AND `
	if onColumns {
		held = ``
	}
	return `SELECT ` + taskColumns + `, true AS duplicate FROM idemgate_tasks
WHERE ` + held + `tenant = @tenant AND idempotency_key = @key AND runtime = @runtime AND network = @network`
}

// submitManySQL is sqlSubmitMany on the digest's arbiter or, if
// onColumns, on the columns'.
func submitManySQL(onColumns bool) string {
	digestCol, digestVal, digestArr, digestAs, conflict := `, key_digest`, `, u.key_digest`, `, @key_digests::bytea[]`, `, key_digest`, conflictOnDigest
	heldArr, heldAs, held := `, @key_digests::bytea[]`, `, key_digest`, `h.key_digest = x.key_digest AND `
	if onColumns {
		digestCol, digestVal, digestArr, digestAs, conflict = ``, ``, ``, ``, conflictOnColumns
		heldArr, heldAs, held = ``, ``, ``
	}
	return `WITH ins AS (
	INSERT INTO idemgate_tasks AS t
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, params, trace,
		run_after, priority, turn` + digestCol + `)
	SELECT u.tenant, u.owner, u.kind, u.runtime, u.network, u.key, u.fingerprint, u.params, u.trace,
		greatest(u.run_after, now()), u.priority,
		CASE WHEN u.run_after > now() THEN ` + unplaced + ` ELSE (SELECT pg_catalog.array_agg(` + turnOf("l.kind", "l.priority", "l.tenant") + ` ORDER BY l.line)
			FROM (SELECT DISTINCT ON (line) line, kind, priority, tenant
				FROM unnest(@lines_of::int[], @kinds::text[], @priorities::smallint[], @tenants::text[])
					AS v(line, kind, priority, tenant)
				ORDER BY line) l)[u.line] + u.nth END` + digestVal + `
	FROM unnest(@tenants::text[], @owners::text[], @kinds::text[], @runtimes::text[], @networks::text[],
		@keys::text[], @fingerprints::text[], @params::jsonb[], @traces::text[],
		@run_afters::timestamptz[], @priorities::smallint[], @lines_of::int[], @nths::bigint[]` + digestArr + `)
		WITH ORDINALITY AS u(tenant, owner, kind, runtime, network, key, fingerprint, params, trace,
			run_after, priority, line, nth` + digestAs + `, ord)
	ORDER BY u.ord
	` + conflict + `
	RETURNING ` + tTaskColumns + `
)
SELECT *, false AS duplicate FROM ins
WHERE (SELECT count(*) FROM (SELECT DISTINCT a.kind FROM ins a
	WHERE a.kind = ANY(coalesce(@notify_kinds::text[], '{}')) AND a.run_after <= now()) k
	WHERE idemgate_tasks_notify(k.kind)) >= 0
UNION ALL
SELECT t.*, true AS duplicate
FROM unnest(@tenants::text[], @keys::text[], @runtimes::text[], @networks::text[]` + heldArr + `)
	AS x(tenant, key, runtime, network` + heldAs + `)
CROSS JOIN LATERAL (SELECT ` + taskColumns + ` FROM idemgate_tasks h
	WHERE ` + held + `h.tenant = x.tenant AND h.idempotency_key = x.key AND h.runtime = x.runtime AND h.network = x.network
	LIMIT 1) t
WHERE (SELECT count(*) FROM ins) < pg_catalog.cardinality(@keys::text[])`
}

// The arbiter: which unique index decides that a key is held (v12).
//
// Since v12 it is a B-tree of key_digest, the 32-byte SHA-256 of the
// full key (tenant, idempotency key, runtime, network; see
// NewTask.digest), as River's unique_key is a hash: one short binary value
// per entry, compared byte for byte, where v2's index held the four texts
// and compared them column by column. The columns stay as they were,
// readable; only the index narrows. The Store computes the digest (in
// Go: computed by the server, in an index expression, it cost more CPU a
// row than the four texts' index did, see docs/performance.md), and a row trigger computes it for a writer that
// leaves it out (an earlier release's Submit, hand-written SQL) and
// again whenever an UPDATE sets a key column or the digest: so every row
// has the digest of its key, unless an INSERT states a wrong one. Two
// keys with one digest would be one key: Submit would find the other
// key's task, see that its full key differs (the lookups compare the
// columns too), and fail after submitTries; SHA-256 makes that a
// theoretical case.
const (
	// conflictOnDigest is v12's ON CONFLICT clause.
	conflictOnDigest = `ON CONFLICT (key_digest) DO NOTHING`
	// conflictOnColumns is v2's, for a schema before v12.
	conflictOnColumns = `ON CONFLICT (tenant, idempotency_key, runtime, network) DO NOTHING`
)

// keyDigestSQL is the digest of the full key of row r, in SQL, as
// NewTask.digest computes it: the UTF-8 bytes of the four texts joined by
// NUL bytes, which no text holds, so that two different keys never join
// to the same bytes.
func keyDigestSQL(r string) string {
	parts := make([]string, 0, 4)
	for _, c := range []string{"tenant", "idempotency_key", "runtime", "network"} {
		parts = append(parts, `pg_catalog.convert_to(`+r+`.`+c+`, 'UTF8'::pg_catalog.name)`)
	}
	return `pg_catalog.sha256(` + strings.Join(parts, ` OPERATOR(pg_catalog.||) E'\\x00'::pg_catalog.bytea OPERATOR(pg_catalog.||) `) + `)`
}

// v12: the digest column and its trigger (one transaction: the trigger
// exists before the backfill reads a row, and every row written from then
// on gets its digest), the backfill, a batch of rows a transaction, and
// the unique index, built concurrently (see sqlCreateWideIndex: no IF NOT
// EXISTS). The column has no default, so adding it is catalog-only. The
// trigger function is hardened as v11's are (pinned search_path,
// operators spelled, EXECUTE revoked: a trigger function needs no grant
// to fire). The insert trigger fires for a row without a digest only (its
// WHEN clause, evaluated without calling the function: a Store's rows
// never call it).
var sqlV12DigestColumn = `ALTER TABLE idemgate_tasks ADD COLUMN IF NOT EXISTS key_digest bytea;
CREATE OR REPLACE FUNCTION idemgate_tasks_key_digest() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	NEW.key_digest := ` + keyDigestSQL("NEW") + `;
	RETURN NEW;
END $$;
DO $$
BEGIN
	EXECUTE pg_catalog.format('ALTER FUNCTION idemgate_tasks_key_digest() SET search_path = pg_catalog, %I, pg_temp',
		pg_catalog.current_schema());
END $$;
REVOKE ALL ON FUNCTION idemgate_tasks_key_digest() FROM PUBLIC;
DROP TRIGGER IF EXISTS idemgate_tasks_key_digest_insert ON idemgate_tasks;
CREATE TRIGGER idemgate_tasks_key_digest_insert BEFORE INSERT ON idemgate_tasks
	FOR EACH ROW WHEN (NEW.key_digest IS NULL) EXECUTE FUNCTION idemgate_tasks_key_digest();
DROP TRIGGER IF EXISTS idemgate_tasks_key_digest_update ON idemgate_tasks;
CREATE TRIGGER idemgate_tasks_key_digest_update BEFORE UPDATE OF tenant, idempotency_key, runtime, network, key_digest
	ON idemgate_tasks FOR EACH ROW EXECUTE FUNCTION idemgate_tasks_key_digest()`

// sqlV12Backfill gives every row written before the trigger its digest,
// 1,000 rows a transaction in primary key order (short row locks; a
// rerun after a kill starts over and finds only the rows left). It sets
// key_digest, which the update trigger computes.
const sqlV12Backfill = `DO $$
DECLARE
	last uuid := '00000000-0000-0000-0000-000000000000';
	ids uuid[];
BEGIN
	LOOP
		SELECT pg_catalog.array_agg(b.id ORDER BY b.id) INTO ids FROM (SELECT t.id FROM idemgate_tasks t
			WHERE t.id OPERATOR(pg_catalog.>) last ORDER BY t.id LIMIT 1000) b;
		EXIT WHEN ids IS NULL;
		UPDATE idemgate_tasks t SET key_digest = NULL
		WHERE t.id OPERATOR(pg_catalog.=) ANY (ids) AND t.key_digest IS NULL;
		last := ids[pg_catalog.cardinality(ids)];
		COMMIT;
	END LOOP;
END $$`

// sqlCreateDigestIndex builds v12's arbiter.
const sqlCreateDigestIndex = `CREATE UNIQUE INDEX CONCURRENTLY idemgate_tasks_key_v12
	ON idemgate_tasks (key_digest)`
