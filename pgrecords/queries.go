package pgrecords

import "strings"

// The records table. One row per key; the primary key is the only index,
// and no update ever changes the key, so every update (extend, complete,
// the reclaim of an expired record) can be a HOT update that touches no
// index, given room on the page: fillfactor leaves it. expires_at is the
// lease's end while claimed and the retention's end once finished.
//
// ident is the claiming request's owner, kind and fingerprint in one
// value (see appendIdent), and response the finished response's status,
// header and body (see appendResponse): a claim compares one column and
// hands back one, which keeps its statement short (see sqlClaim).
const sqlV1 = `
CREATE TABLE idemgate_records (
	key         text        NOT NULL PRIMARY KEY,
	token       uuid        NOT NULL,
	finished    boolean     NOT NULL DEFAULT false,
	expires_at  timestamptz NOT NULL,
	ident       bytea       NOT NULL,
	sums        bytea,
	response    bytea
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_insert_scale_factor = 0.02);

-- idemgate_records_claim is the write side of sqlClaim, called only when
-- the statement found no live record: it inserts the claim, or else
-- reclaims the expired record in place, and returns 1. It returns 0 when
-- a live record stands in the way after all: a concurrent claim committed
-- it after the statement's snapshot was taken. (The insert does nothing
-- on a conflict, which costs less than DO UPDATE … WHERE expired on the
-- common path, a new key; each statement here sees what committed before
-- it.)
CREATE FUNCTION idemgate_records_claim(p_key text, p_token uuid, p_ident bytea, p_sums bytea, p_lease_us bigint)
RETURNS smallint
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO idemgate_records (key, token, finished, expires_at, ident, sums)
	VALUES (p_key, p_token, false, now() + p_lease_us * interval '1 microsecond', p_ident, p_sums)
	ON CONFLICT (key) DO NOTHING;
	IF FOUND THEN
		RETURN 1;
	END IF;
	UPDATE idemgate_records SET token = p_token, finished = false,
		expires_at = now() + p_lease_us * interval '1 microsecond', ident = p_ident, sums = p_sums, response = NULL
	WHERE key = p_key AND expires_at <= now();
	IF FOUND THEN
		RETURN 1;
	END IF;
	RETURN 0;
END
$$;
`

// sqlV2 adds the completion of an Atomic route's record inside the
// handler's transaction. It raises SQLSTATE IG001 when the record is not
// claimed with the token at that moment (clock_timestamp(), not the
// transaction's start): the transaction is then aborted, so a COMMIT sent
// with it in the same round trip rolls back, and nothing of the handler's
// writes takes effect. The retention also counts from clock_timestamp():
// a handler may have run for a while since its transaction began.
const sqlV2 = `
CREATE FUNCTION idemgate_records_complete_tx(p_key text, p_token uuid, p_retention_us bigint, p_response bytea)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
	UPDATE idemgate_records SET finished = true,
		expires_at = clock_timestamp() + p_retention_us * interval '1 microsecond', response = p_response
	WHERE key = p_key AND token = p_token AND NOT finished AND expires_at > clock_timestamp();
	IF NOT FOUND THEN
		RAISE EXCEPTION 'idemgate: lease lost' USING ERRCODE = 'IG001';
	END IF;
END
$$;
`

// sqlV3 replaces the completion of an Atomic route's record with one that
// holds whatever the handler did to its transaction's session state:
//
//   - It checks that it runs in the transaction the store opened: BEGIN
//     goes out with SET LOCAL idemgate.tx = 'pgrecords' (sqlMark), which
//     a transaction the handler began itself (ROLLBACK; BEGIN in one
//     Exec, RESET ALL) does not carry. Anything else raises IG002, and the
//     COMMIT sent with it rolls back.
//   - Its search_path is pinned to the schema it was created in (pg_temp
//     last), and the store calls it schema-qualified: a handler's SET LOCAL
//     search_path (a schema per tenant) finds it and its table all the same.
//   - It runs with its owner's rights (SECURITY DEFINER), so a handler's
//     SET LOCAL ROLE (row-level security) needs only USAGE on the schema,
//     not rights on the records table; the role stays the handler's for
//     the COMMIT, and for the deferred triggers that run in it.
//
// With p_key NULL it only checks the transaction: the commit of a request
// that holds no claim.
//
// It also names the records table by its schema in idemgate_records_claim
// (see queries).
//
// Its DO blocks run at migration time, as the migrating role: they call
// pg_catalog's format and current_schema by that name, so that a
// public.format(text, name) planted before the first Migrate (an exact
// match where pg_catalog's takes VARIADIC "any") does not run with the
// migrating role's rights (TestMigrateFromScratchRunsNothingPlanted). An
// edit of an applied version: the runner records versions, not their
// text, and the statements create the same objects.
const sqlV3 = `
CREATE FUNCTION idemgate_records_commit_tx(p_key text, p_token uuid, p_retention_us bigint, p_response bytea)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
	IF current_setting('idemgate.tx', true) IS DISTINCT FROM 'pgrecords' THEN
		RAISE EXCEPTION 'idemgate: not the transaction the store opened' USING ERRCODE = 'IG002';
	END IF;
	IF p_key IS NULL THEN
		RETURN;
	END IF;
	UPDATE idemgate_records SET finished = true,
		expires_at = clock_timestamp() + p_retention_us * interval '1 microsecond', response = p_response
	WHERE key = p_key AND token = p_token AND NOT finished AND expires_at > clock_timestamp();
	IF NOT FOUND THEN
		RAISE EXCEPTION 'idemgate: lease lost' USING ERRCODE = 'IG001';
	END IF;
END
$$;

DO $$
BEGIN
	EXECUTE pg_catalog.format('ALTER FUNCTION idemgate_records_commit_tx(text, uuid, bigint, bytea) SET search_path = %I, pg_temp', pg_catalog.current_schema());
END
$$;

-- idemgate_records_claim as in version 1, its table named by its schema:
-- a session whose search_path the handler of an Atomic route changed (SET
-- search_path, committed) claims in the store's table all the same.
DO $do$
BEGIN
	EXECUTE pg_catalog.format($f$
CREATE OR REPLACE FUNCTION %1$I.idemgate_records_claim(p_key text, p_token uuid, p_ident bytea, p_sums bytea, p_lease_us bigint)
RETURNS smallint
LANGUAGE plpgsql AS $body$
BEGIN
	INSERT INTO %1$I.idemgate_records (key, token, finished, expires_at, ident, sums)
	VALUES (p_key, p_token, false, now() + p_lease_us * interval '1 microsecond', p_ident, p_sums)
	ON CONFLICT (key) DO NOTHING;
	IF FOUND THEN
		RETURN 1;
	END IF;
	UPDATE %1$I.idemgate_records SET token = p_token, finished = false,
		expires_at = now() + p_lease_us * interval '1 microsecond', ident = p_ident, sums = p_sums, response = NULL
	WHERE key = p_key AND expires_at <= now();
	IF FOUND THEN
		RETURN 1;
	END IF;
	RETURN 0;
END
$body$
$f$, pg_catalog.current_schema());
END
$do$;
`

// sqlV4 rewrites every function of the schema so that nothing a role
// can create on a search path runs in it (a role with CREATE on public
// planted an operator public.*(bigint, interval), an exact match where
// pg_catalog has only float8 * interval, and the SECURITY DEFINER
// completion ran it with its owner's rights):
//
//   - every operator is pg_catalog's, named as such (OPERATOR(pg_catalog.*)),
//     every function called by its pg_catalog name, every argument cast to
//     the pg_catalog type the operator takes (bigint to float8, as the
//     implicit cast did): a call that an exact match elsewhere could win
//     has none left;
//   - each function pins its search_path to pg_catalog, then its schema,
//     then pg_temp (which PostgreSQL never searches for functions or
//     operators, and here last for tables), and names its table by its
//     schema;
//   - EXECUTE is revoked from PUBLIC: only the owner (the role that ran
//     Migrate) and roles granted it explicitly may call them (see
//     docs/atomic-routes.md, "Roles").
//
// idemgate_records_complete_tx (v2) is no longer called by this code; it
// gets the same treatment for a node of an older build during a rolling
// upgrade.
const sqlV4 = `
DO $do$
DECLARE
	s text := pg_catalog.quote_ident(pg_catalog.current_schema()::pg_catalog.text);
BEGIN
	EXECUTE pg_catalog.format($f$
CREATE OR REPLACE FUNCTION %1$s.idemgate_records_claim(p_key text, p_token uuid, p_ident bytea, p_sums bytea, p_lease_us bigint)
RETURNS smallint
LANGUAGE plpgsql
SET search_path = pg_catalog, %1$s, pg_temp
AS $body$
BEGIN
	INSERT INTO %1$s.idemgate_records (key, token, finished, expires_at, ident, sums)
	VALUES (p_key, p_token, false,
		pg_catalog.now() OPERATOR(pg_catalog.+) (p_lease_us::pg_catalog.float8 OPERATOR(pg_catalog.*) '1 microsecond'::pg_catalog.interval),
		p_ident, p_sums)
	ON CONFLICT (key) DO NOTHING;
	IF FOUND THEN
		RETURN 1;
	END IF;
	UPDATE %1$s.idemgate_records SET token = p_token, finished = false,
		expires_at = pg_catalog.now() OPERATOR(pg_catalog.+) (p_lease_us::pg_catalog.float8 OPERATOR(pg_catalog.*) '1 microsecond'::pg_catalog.interval),
		ident = p_ident, sums = p_sums, response = NULL
	WHERE key OPERATOR(pg_catalog.=) p_key AND expires_at OPERATOR(pg_catalog.<=) pg_catalog.now();
	IF FOUND THEN
		RETURN 1;
	END IF;
	RETURN 0;
END
$body$
$f$, s);

	EXECUTE pg_catalog.format($f$
CREATE OR REPLACE FUNCTION %1$s.idemgate_records_commit_tx(p_key text, p_token uuid, p_retention_us bigint, p_response bytea)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, %1$s, pg_temp
AS $body$
BEGIN
	IF NOT COALESCE(pg_catalog.current_setting('idemgate.tx', true) OPERATOR(pg_catalog.=) 'pgrecords'::pg_catalog.text, false) THEN
		RAISE EXCEPTION 'idemgate: not the transaction the store opened' USING ERRCODE = 'IG002';
	END IF;
	IF p_key IS NULL THEN
		RETURN;
	END IF;
	UPDATE %1$s.idemgate_records SET finished = true,
		expires_at = pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) (p_retention_us::pg_catalog.float8 OPERATOR(pg_catalog.*) '1 microsecond'::pg_catalog.interval),
		response = p_response
	WHERE key OPERATOR(pg_catalog.=) p_key AND token OPERATOR(pg_catalog.=) p_token AND NOT finished
		AND expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp();
	IF NOT FOUND THEN
		RAISE EXCEPTION 'idemgate: lease lost' USING ERRCODE = 'IG001';
	END IF;
END
$body$
$f$, s);

	EXECUTE pg_catalog.format($f$
CREATE OR REPLACE FUNCTION %1$s.idemgate_records_complete_tx(p_key text, p_token uuid, p_retention_us bigint, p_response bytea)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, %1$s, pg_temp
AS $body$
BEGIN
	UPDATE %1$s.idemgate_records SET finished = true,
		expires_at = pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) (p_retention_us::pg_catalog.float8 OPERATOR(pg_catalog.*) '1 microsecond'::pg_catalog.interval),
		response = p_response
	WHERE key OPERATOR(pg_catalog.=) p_key AND token OPERATOR(pg_catalog.=) p_token AND NOT finished
		AND expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp();
	IF NOT FOUND THEN
		RAISE EXCEPTION 'idemgate: lease lost' USING ERRCODE = 'IG001';
	END IF;
END
$body$
$f$, s);

	EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %1$s.idemgate_records_claim(text, uuid, bytea, bytea, bigint) FROM PUBLIC', s);
	EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %1$s.idemgate_records_commit_tx(text, uuid, bigint, bytea) FROM PUBLIC', s);
	EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %1$s.idemgate_records_complete_tx(text, uuid, bigint, bytea) FROM PUBLIC', s);
END
$do$;
`

const (
	// sqlClaim is a claim: one read by primary key of the live record, if
	// any. Only when there is none does it call idemgate_records_claim,
	// which inserts the claim or reclaims the expired record in place; a
	// replay, a conflict, a
	// running holder or a resent claim writes nothing and takes no lock.
	// claimed 0 means that a concurrent claim won after the snapshot: the
	// claim runs again and reads the winner. The stored response leaves
	// the database only for a request whose ident (owner, kind and
	// fingerprint) is the record's, byte for byte.
	//
	// Its executor work is mostly setting up expressions, per execution,
	// so it has as few as it can: columns are returned as they are and
	// compared in Go, but for the one CASE that guards the response and
	// the one that calls the function. (Three guarded response columns,
	// each comparing fingerprint, owner and kind, and the outcome computed
	// in SQL cost about 1.6 times the instructions per claim; a CTE read
	// twice, with the function in a UNION ALL branch, more still.)
	sqlClaim = `SELECT c.token, c.finished, c.expires_at, pg_catalog.now(), c.ident, c.sums,
	CASE WHEN c.ident OPERATOR(pg_catalog.=) $3::pg_catalog.bytea THEN c.response END,
	CASE WHEN c.key IS NULL THEN idemgate_records_claim($1::pg_catalog.text, $2::pg_catalog.uuid, $3::pg_catalog.bytea, $4::pg_catalog.bytea, $5::pg_catalog.int8) END
FROM (SELECT) AS one
LEFT JOIN idemgate_records AS c ON c.key OPERATOR(pg_catalog.=) $1::pg_catalog.text AND c.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()`

	sqlExtend = `UPDATE idemgate_records SET expires_at = pg_catalog.now() OPERATOR(pg_catalog.+) ($3::pg_catalog.int8::pg_catalog.float8 OPERATOR(pg_catalog.*) '1 microsecond'::pg_catalog.interval)
WHERE ` + sqlLiveClaim

	// sqlComplete finishes the claim. When it matches nothing,
	// sqlCompleted tells a resent complete (the token's record is finished
	// already, and keeps what it holds) from a lost lease.
	sqlComplete = `UPDATE idemgate_records SET finished = true,
	expires_at = pg_catalog.now() OPERATOR(pg_catalog.+) ($3::pg_catalog.int8::pg_catalog.float8 OPERATOR(pg_catalog.*) '1 microsecond'::pg_catalog.interval), response = $4::pg_catalog.bytea
WHERE ` + sqlLiveClaim

	sqlCompleted = `SELECT finished FROM idemgate_records
WHERE key OPERATOR(pg_catalog.=) $1::pg_catalog.text AND token OPERATOR(pg_catalog.=) $2::pg_catalog.uuid
	AND expires_at OPERATOR(pg_catalog.>) pg_catalog.now()`

	// sqlCommitTx finishes an Atomic route's record in the handler's
	// transaction (see sqlV3); sqlCommit goes in
	// the same round trip. sqlResume goes in front of them: a handler's
	// tiny statement_timeout or lock_timeout (SET LOCAL) would cancel the
	// completion, so both go back to the session's defaults for the rest
	// of the transaction, each statement getting its own timer.
	sqlCommitTx = `SELECT idemgate_records_commit_tx($1::pg_catalog.text, $2::pg_catalog.uuid, $3::pg_catalog.int8, $4::pg_catalog.bytea)`
	sqlCommit   = `COMMIT`
	sqlRollback = `ROLLBACK`

	sqlResumeStatementTimeout = `SET LOCAL statement_timeout TO DEFAULT`
	sqlResumeLockTimeout      = `SET LOCAL lock_timeout TO DEFAULT`

	// sqlMark marks the transaction as the store's, with BEGIN: a SET, not
	// a SELECT, so that it takes no snapshot and the handler can still
	// set its isolation level (SET TRANSACTION) first thing.
	sqlMark = `SET LOCAL idemgate.tx = 'pgrecords'`
	// sqlMarked tells, at a rollback, whether the transaction is still
	// the one BEGIN opened.
	sqlMarked = `SELECT COALESCE(pg_catalog.current_setting('idemgate.tx', true) OPERATOR(pg_catalog.=) 'pgrecords'::pg_catalog.text, false)`

	// sqlSession reads the schema the store's table lives in (Migrate's)
	// and the session's idle_in_transaction_session_timeout, in ms.
	sqlSession = `SELECT pg_catalog.current_schema(), (SELECT setting::pg_catalog.int8 FROM pg_catalog.pg_settings
	WHERE name OPERATOR(pg_catalog.=) 'idle_in_transaction_session_timeout'::pg_catalog.text)`

	sqlRelease = `DELETE FROM idemgate_records WHERE ` + sqlLiveClaim

	// sqlSweep deletes one batch of expired records. SKIP LOCKED lets many
	// nodes sweep at once, each taking rows the others do not hold, and
	// leaves a record that a claim is reclaiming to that claim; the outer
	// condition checks the row again as it is deleted.
	sqlSweep = `DELETE FROM idemgate_records
WHERE ctid OPERATOR(pg_catalog.=) ANY (
	SELECT ctid FROM idemgate_records WHERE expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
	LIMIT $1::pg_catalog.int8 FOR UPDATE SKIP LOCKED
) AND expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()`

	// sqlLiveClaim matches the record of key $1 claimed with token $2
	// whose lease has not run out.
	sqlLiveClaim = `key OPERATOR(pg_catalog.=) $1::pg_catalog.text AND token OPERATOR(pg_catalog.=) $2::pg_catalog.uuid
	AND NOT finished AND expires_at OPERATOR(pg_catalog.>) pg_catalog.now()`
)

// queries are the statements of a Store whose table lives in one schema,
// every name of the schema's qualified with it. The handler of an Atomic
// route may set another search_path, with SET LOCAL for its transaction
// (the completion runs in it) or with SET for the session, which stays on
// the pool's connection after its transaction commits: the store's
// statements on that connection must still find its table and functions,
// and not another schema's.
type queries struct {
	claim, extend, complete, completed, release, sweep, commitTx, inspect, forget string
}

// newQueries returns the queries of the schema whose quoted name is
// schema. Every name in them that begins with idemgate_records is a table
// or a function of that schema.
func newQueries(schema string) queries {
	q := func(sql string) string {
		return strings.ReplaceAll(sql, "idemgate_records", schema+".idemgate_records")
	}
	return queries{claim: q(sqlClaim), extend: q(sqlExtend), complete: q(sqlComplete), completed: q(sqlCompleted),
		release: q(sqlRelease), sweep: q(sqlSweep), commitTx: q(sqlCommitTx), inspect: q(sqlInspect), forget: q(sqlForget)}
}
