package pgrecords

// The records table. One row per key; the primary key is the only index,
// and no update ever changes the key, so every update (extend, complete,
// the reclaim of an expired record) can be a HOT update that touches no
// index, given room on the page: fillfactor leaves it. expires_at is the
// lease's end while claimed and the retention's end once finished.
//
// A claim is one statement (sqlClaim); see there.
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

-- idemgate_records_claim is the write side of sqlClaim: it inserts the
-- claim or reclaims an expired record, and when a live record stands in
-- the way, reads it (each statement of a function sees what committed
-- before it) and answers as sqlClaim does.
CREATE FUNCTION idemgate_records_claim(p_key text, p_token uuid, p_fp text, p_owner text, p_kind text, p_sums bytea, p_lease_us bigint,
	OUT outcome smallint, OUT left_us bigint, OUT sums bytea, OUT status smallint, OUT header bytea, OUT body bytea)
LANGUAGE plpgsql AS $$
DECLARE
	r record;
BEGIN
	FOR i IN 1..5 LOOP
		INSERT INTO idemgate_records AS t (key, token, finished, expires_at, fingerprint, owner, kind, sums)
		VALUES (p_key, p_token, false, now() + p_lease_us * interval '1 microsecond', p_fp, p_owner, p_kind, p_sums)
		ON CONFLICT (key) DO UPDATE SET token = excluded.token, finished = false, expires_at = excluded.expires_at,
			fingerprint = excluded.fingerprint, owner = excluded.owner, kind = excluded.kind, sums = excluded.sums,
			status = NULL, header = NULL, body = NULL
		WHERE t.expires_at <= now();
		IF FOUND THEN
			outcome := 1;
			RETURN;
		END IF;
		SELECT t.token, t.finished, t.expires_at, t.fingerprint, t.owner, t.kind, t.sums, t.status, t.header, t.body
		INTO r FROM idemgate_records AS t WHERE t.key = p_key;
		IF FOUND AND r.expires_at > now() THEN
			IF NOT r.finished AND r.token = p_token THEN
				outcome := 1;
			ELSIF r.owner <> p_owner OR r.kind <> p_kind THEN
				outcome := 4;
			ELSIF r.fingerprint <> p_fp THEN
				outcome := 4; sums := r.sums;
			ELSIF r.finished THEN
				outcome := 3; status := r.status; header := r.header; body := r.body;
			ELSE
				outcome := 2; left_us := (extract(epoch FROM r.expires_at - now()) * 1000000)::bigint;
			END IF;
			RETURN;
		END IF;
	END LOOP;
	RAISE EXCEPTION 'idemgate_records_claim: key % did not settle', p_key;
END
$$;
`

const (
	// sqlClaim answers from the live record when there is one: a replay,
	// a conflict, a running holder or a resent claim is a plain read by
	// primary key that writes nothing and takes no lock. Only when no live
	// record exists does the second branch call idemgate_records_claim,
	// which inserts the claim or reclaims the expired record in place (ON
	// CONFLICT … DO UPDATE … WHERE expired) and, when a concurrent claim
	// won, reads the winner. The fingerprint, owner and kind are compared
	// here, in the database: the stored response leaves it only for a
	// request that matches, and the field digests only for one of the
	// record's owner and kind.
	sqlClaim = `WITH cur AS (
	SELECT token, finished, expires_at, fingerprint = $3 AS same_fp, owner = $4 AND kind = $5 AS same_owner,
		sums, status, header, body
	FROM idemgate_records WHERE key = $1 AND expires_at > now()
)
SELECT CASE
		WHEN NOT c.finished AND c.token = $2 THEN 1
		WHEN NOT (c.same_owner AND c.same_fp) THEN 4
		WHEN c.finished THEN 3
		ELSE 2
	END::smallint AS outcome,
	CASE WHEN NOT c.finished AND c.token <> $2 AND c.same_owner AND c.same_fp
		THEN (extract(epoch FROM c.expires_at - now()) * 1000000)::bigint END AS left_us,
	CASE WHEN c.same_owner AND NOT c.same_fp AND (c.finished OR c.token <> $2) THEN c.sums END AS sums,
	CASE WHEN c.finished AND c.same_owner AND c.same_fp THEN c.status END AS status,
	CASE WHEN c.finished AND c.same_owner AND c.same_fp THEN c.header END AS header,
	CASE WHEN c.finished AND c.same_owner AND c.same_fp THEN c.body END AS body
FROM cur AS c
UNION ALL
SELECT * FROM idemgate_records_claim($1, $2, $3, $4, $5, $6, $7) WHERE NOT EXISTS (SELECT FROM cur)`

	sqlExtend = `UPDATE idemgate_records SET expires_at = now() + $3 * interval '1 microsecond'
WHERE key = $1 AND token = $2 AND NOT finished AND expires_at > now()`

	// sqlComplete finishes the claim. A record that the token already
	// finished (a resent complete whose first run succeeded) matches too,
	// and keeps what it holds: the row is rewritten unchanged.
	sqlComplete = `UPDATE idemgate_records SET finished = true,
	expires_at = CASE WHEN finished THEN expires_at ELSE now() + $3 * interval '1 microsecond' END,
	status = CASE WHEN finished THEN status ELSE $4 END,
	header = CASE WHEN finished THEN header ELSE $5 END,
	body = CASE WHEN finished THEN body ELSE $6 END
WHERE key = $1 AND token = $2 AND expires_at > now()`

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
