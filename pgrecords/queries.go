package pgrecords

// The records table. One row per key; the primary key is the only index,
// and no update ever changes the key, so every update (extend, complete,
// the reclaim of an expired record) can be a HOT update that touches no
// index, given room on the page: fillfactor leaves it. expires_at is the
// lease's end while claimed and the retention's end once finished.
//
// claim is a function so that a claim is one round trip however it ends:
// it reads the record first (a replay, the commonest hit, writes nothing
// and takes no lock), inserts or reclaims an expired one with INSERT … ON
// CONFLICT DO UPDATE … WHERE expired, and when a concurrent claim won the
// race it reads again (each statement of a plpgsql function sees what
// committed before it). The comparison of fingerprint, owner and kind
// happens here, in the database: the stored response leaves it only for a
// request that matches, and the field digests only for one of the record's
// owner and kind.
const sqlV1 = `
CREATE TABLE idemgate_records (
	key         text        NOT NULL PRIMARY KEY,
	token       uuid        NOT NULL,
	finished    boolean     NOT NULL DEFAULT false,
	expires_at  timestamptz NOT NULL,
	fingerprint text        NOT NULL,
	owner       text        NOT NULL,
	kind        text        NOT NULL,
	sums        bytea,
	status      smallint,
	header      bytea,
	body        bytea
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_insert_scale_factor = 0.02);

CREATE FUNCTION idemgate_records_claim(p_key text, p_token uuid, p_fp text, p_owner text, p_kind text,
	p_sums bytea, p_lease_us bigint)
RETURNS TABLE (outcome smallint, left_us bigint, sums bytea, status smallint, header bytea, body bytea)
LANGUAGE plpgsql AS $$
DECLARE
	r idemgate_records%ROWTYPE;
BEGIN
	FOR i IN 1..5 LOOP
		SELECT * INTO r FROM idemgate_records AS t WHERE t.key = p_key;
		IF FOUND AND r.expires_at > now() THEN
			IF NOT r.finished AND r.token = p_token THEN
				-- A resent claim: its own.
				RETURN QUERY SELECT 1::smallint, NULL::bigint, NULL::bytea, NULL::smallint, NULL::bytea, NULL::bytea;
			ELSIF r.owner <> p_owner OR r.kind <> p_kind THEN
				RETURN QUERY SELECT 4::smallint, NULL::bigint, NULL::bytea, NULL::smallint, NULL::bytea, NULL::bytea;
			ELSIF r.fingerprint <> p_fp THEN
				RETURN QUERY SELECT 4::smallint, NULL::bigint, r.sums, NULL::smallint, NULL::bytea, NULL::bytea;
			ELSIF r.finished THEN
				RETURN QUERY SELECT 3::smallint, NULL::bigint, NULL::bytea, r.status, r.header, r.body;
			ELSE
				RETURN QUERY SELECT 2::smallint,
					(extract(epoch FROM r.expires_at - now()) * 1000000)::bigint,
					NULL::bytea, NULL::smallint, NULL::bytea, NULL::bytea;
			END IF;
			RETURN;
		END IF;
		INSERT INTO idemgate_records AS t (key, token, finished, expires_at, fingerprint, owner, kind, sums)
		VALUES (p_key, p_token, false, now() + p_lease_us * interval '1 microsecond', p_fp, p_owner, p_kind, p_sums)
		ON CONFLICT (key) DO UPDATE SET token = excluded.token, finished = false, expires_at = excluded.expires_at,
			fingerprint = excluded.fingerprint, owner = excluded.owner, kind = excluded.kind, sums = excluded.sums,
			status = NULL, header = NULL, body = NULL
		WHERE t.expires_at <= now();
		IF FOUND THEN
			RETURN QUERY SELECT 1::smallint, NULL::bigint, NULL::bytea, NULL::smallint, NULL::bytea, NULL::bytea;
			RETURN;
		END IF;
		-- A live record that this statement's first read did not see: read again.
	END LOOP;
	RAISE EXCEPTION 'idemgate_records_claim: key % did not settle', p_key;
END
$$;
`

const (
	sqlClaim = `SELECT outcome, left_us, sums, status, header, body
FROM idemgate_records_claim($1, $2, $3, $4, $5, $6, $7)`

	sqlExtend = `UPDATE idemgate_records SET expires_at = now() + $3 * interval '1 microsecond'
WHERE key = $1 AND token = $2 AND NOT finished AND expires_at > now()`

	// sqlComplete finishes the claim, or (a resent complete whose first run
	// succeeded) finds it finished with the same token already.
	sqlComplete = `WITH done AS (
	UPDATE idemgate_records SET finished = true, expires_at = now() + $3 * interval '1 microsecond',
		status = $4, header = $5, body = $6
	WHERE key = $1 AND token = $2 AND NOT finished AND expires_at > now()
	RETURNING 1
)
SELECT EXISTS (SELECT FROM done)
	OR EXISTS (SELECT FROM idemgate_records WHERE key = $1 AND token = $2 AND finished AND expires_at > now())`

	sqlRelease = `DELETE FROM idemgate_records
WHERE key = $1 AND token = $2 AND NOT finished AND expires_at > now()`

	// sqlSweep deletes one batch of expired records. SKIP LOCKED lets many
	// nodes sweep at once, each taking rows the others do not hold, and
	// leaves a record that a claim is reclaiming to that claim; the outer
	// condition checks the row again as it is deleted.
	sqlSweep = `DELETE FROM idemgate_records
WHERE ctid IN (
	SELECT ctid FROM idemgate_records WHERE expires_at <= now()
	LIMIT $1 FOR UPDATE SKIP LOCKED
) AND expires_at <= now()`
)
