// Package pgrecords is a idemgate.Store on PostgreSQL: idempotency
// records in the database an application already runs, with no Redis.
//
// Each record is one row of idemgate_records, keyed by the idempotency key
// alone. Every transition is one statement, so one round trip: a claim
// reads the record and inserts or reclaims it only when none is live, and
// extend, complete and release are one UPDATE or DELETE each, fenced by
// the claim's token. Times come from the database's now(), so all nodes
// fence against one clock. A miss costs two round trips (claim, complete),
// a replay one, a conflict one, plus one extend per Lease/3 of handler
// time. A replay or conflict is a plain read by primary key; only a claim
// that finds no live record calls a function that writes.
//
// Atomic routes (middleware.Config.Atomic): Store implements
// idemgate.TxStore. The handler runs in a transaction on a connection of
// the pool (TxFromContext) and the record is completed in it, fenced by
// the claim's token at the commit, with the COMMIT in the same round trip:
// the handler's writes, the tasks it submits with pgstore.SubmitTx and the
// stored answer commit together or not at all. BEGIN goes out with the
// handler's first statement and the completion with COMMIT, so a miss
// costs the round trips of a route that is not Atomic; a replay opens no
// transaction.
//
// Expired records stay until the next claim of their key reclaims them or
// Sweep deletes them in small batches. The table has one index, the
// primary key, which no update changes, and a fillfactor of 70: updates
// are HOT, and the table stays small under a hot claim/complete load.
package pgrecords

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/migrate"
)

// Store keeps idempotency records in PostgreSQL. It is safe for concurrent
// use.
type Store struct {
	pool *pgxpool.Pool
	// sweepBatch is the number of records one Sweep statement deletes at
	// most (default 1000): small batches hold few row locks and a short
	// transaction.
	sweepBatch int
	// slots bounds the Atomic transactions that hold a connection at once
	// to the pool's MaxConns less one, with every Store on the pool
	// (slotsOf): claims, completions and renewals always find one, and no
	// handler waits for a connection that only another handler's
	// transaction could give back.
	slots chan struct{}
	// q are the store's statements in the schema of the pool's sessions.
	q queries
	// idleLimit is the idle_in_transaction_session_timeout the pool's
	// sessions start with (0: none), which an Atomic transaction keeps
	// when it is lower than the route's (see idleLimit).
	idleLimit time.Duration
}

var _ idemgate.Store = (*Store)(nil)

// New returns a Store on pool. The caller keeps ownership of pool (and
// closes it). New checks that the pool answers, and reads what its
// sessions start with: their idle_in_transaction_session_timeout, and the
// schema they use (the first of their search_path that exists), where
// Migrate puts the records table and where an Atomic route's completion
// finds it whatever search_path the handler set; it does not migrate:
// call Migrate once per deployment (or at every start: it is
// idempotent).
func New(ctx context.Context, pool *pgxpool.Pool) (*Store, error) {
	if pool == nil {
		return nil, errors.New("pgrecords: nil pool")
	}
	var (
		schema *string
		idleMs int64
	)
	if err := pool.QueryRow(ctx, sqlSession).Scan(&schema, &idleMs); err != nil {
		return nil, fmt.Errorf("pgrecords: ping: %w", err)
	}
	if schema == nil {
		return nil, errors.New("pgrecords: the pool's search_path names no existing schema for the records table")
	}
	return &Store{pool: pool, sweepBatch: 1000,
		slots:     slotsOf(pool),
		q:         newQueries(pgx.Identifier{*schema}.Sanitize()),
		idleLimit: time.Duration(idleMs) * time.Millisecond}, nil
}

// migrations is the schema history of the records table, oldest first.
var migrations = []migrate.Migration{
	{Version: 1, Name: "create idemgate_records", SQL: sqlV1},
	{Version: 2, Name: "create idemgate_records_complete_tx", SQL: sqlV2},
	{Version: 3, Name: "create idemgate_records_commit_tx", SQL: sqlV3},
	{Version: 4, Name: "pin the functions' operators and search_path, revoke EXECUTE from PUBLIC", SQL: sqlV4},
}

// Migrate brings the records table to the newest version in the pool's
// current schema. It is idempotent and safe to call from many nodes at
// once (one migrates, the others wait on an advisory lock); it uses a
// connection of its own. Its versions are recorded apart from pgstore's,
// so both may live in one schema.
func (s *Store) Migrate(ctx context.Context) error {
	r := migrationRunner()
	return r.Run(ctx, s.pool)
}

// Sweep deletes expired records in batches until none is left, and
// returns how many it deleted. Many nodes may sweep at once: each batch
// skips the rows another holds. A record is expired once its lease (while
// claimed) or its retention (once finished) has run out; the next claim of
// its key would reclaim it anyway, so Sweep only bounds the table's size.
// Sweep returns early, with what it deleted so far, when ctx ends.
func (s *Store) Sweep(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := s.pool.Exec(ctx, s.q.sweep, s.sweepBatch)
		if err != nil {
			return total, fmt.Errorf("pgrecords: sweep: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(s.sweepBatch) {
			return total, nil
		}
	}
}

// maxClaimTries bounds the claims of one key that lose a race (see Claim).
// Each lost try means another claim took the key and its record lapsed
// again before this one's next statement ran: only leases shorter than a
// round trip come near the bound, and on a loaded machine (round trips of
// several milliseconds, leases of 1 ms in TestSweepRacesClaims) five tries
// ran out; a try costs nothing unless the race is lost.
const maxClaimTries = 16

// Claim implements idemgate.Store.
func (s *Store) Claim(ctx context.Context, key string, req idemgate.ClaimRequest) (idemgate.ClaimResult, error) {
	var sums []byte
	if len(req.Fields) > 0 {
		sums = make([]byte, 0, len(req.Fields)*len(fingerprint.FieldSum{}))
		for _, f := range req.Fields {
			sums = append(sums, f[:]...)
		}
	}
	ident := appendIdent(nil, req.Owner, req.Kind, string(req.Fingerprint))
	// A claim that loses a race for a free key to a concurrent claim runs
	// again and reads the winner; the key would have to change hands on
	// every try (claimed, released or expired, claimed again) to exhaust
	// the tries.
	for try := 0; ; try++ {
		res, retry, err := s.claim(ctx, key, req, ident, sums)
		if !retry {
			return res, err
		}
		if try == maxClaimTries-1 {
			return idemgate.ClaimResult{}, fmt.Errorf("pgrecords: claim: key did not settle in %d tries", maxClaimTries)
		}
	}
}

// claim runs sqlClaim once. retry reports a claim that lost a race and
// must run again.
func (s *Store) claim(ctx context.Context, key string, req idemgate.ClaimRequest, ident, sums []byte) (_ idemgate.ClaimResult, retry bool, _ error) {
	rows, err := s.pool.Query(ctx, s.q.claim, key, uuid(req.Token), ident, sums, micros(req.Lease))
	if err != nil {
		return claimError(err)
	}
	defer rows.Close()
	if !rows.Next() {
		rows.Close()
		if err := rows.Err(); err != nil {
			return claimError(err)
		}
		return idemgate.ClaimResult{}, false, fmt.Errorf("pgrecords: claim: %w", pgx.ErrNoRows)
	}
	var row claimRow
	if err := row.read(rows); err != nil {
		rows.Close()
		return idemgate.ClaimResult{}, false, fmt.Errorf("pgrecords: claim: %w", err)
	}
	if row.claimed.Valid && row.claimed.Int16 == 0 {
		return idemgate.ClaimResult{}, true, nil
	}
	// The row's byte slices may alias the connection's read buffer: the
	// outcome is decided, and what it keeps copied, before the rows close.
	res, err := row.outcome(req, ident)
	if err != nil {
		return res, false, fmt.Errorf("pgrecords: claim: %w", err)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return claimError(err)
	}
	return res, false, nil
}

// claimError is the result of a claim statement that failed with err. A
// session that defaults to REPEATABLE READ or SERIALIZABLE fails a claim
// that lost a race to a concurrent one (40001) where READ COMMITTED
// returns claimed 0: both run again.
func claimError(err error) (idemgate.ClaimResult, bool, error) {
	if serializationFailure(err) {
		return idemgate.ClaimResult{}, true, nil
	}
	return idemgate.ClaimResult{}, false, fmt.Errorf("pgrecords: claim: %w", err)
}

// claimRow is the row sqlClaim returns.
type claimRow struct {
	token     pgtype.UUID // invalid when no live record was found
	finished  bool
	left      time.Duration // of the record's lease or retention
	heldIdent []byte
	heldSums  []byte
	response  []byte // the record's, when its ident is the claim's
	claimed   pgtype.Int2
}

// claimFields are the types of sqlClaim's columns, in order.
var claimFields = [...]uint32{pgtype.UUIDOID, pgtype.BoolOID, pgtype.TimestamptzOID, pgtype.TimestamptzOID,
	pgtype.ByteaOID, pgtype.ByteaOID, pgtype.ByteaOID, pgtype.Int2OID}

// read reads the current row of rows. In binary format (the default exec
// mode's, and the describe modes') it decodes the columns' bytes itself,
// allocating nothing: the byte slices then alias rows' buffer, valid until
// rows move on or close. In text format (the simple protocol and exec
// mode) it scans them.
func (r *claimRow) read(rows pgx.Rows) error {
	fields, vals := rows.FieldDescriptions(), rows.RawValues()
	if len(fields) != len(claimFields) || len(vals) != len(claimFields) {
		return fmt.Errorf("%d columns, want %d", len(fields), len(claimFields))
	}
	for i, f := range fields {
		if f.Format != pgx.BinaryFormatCode || f.DataTypeOID != claimFields[i] {
			return r.scan(rows)
		}
	}
	token, finished, expires, now, claimed := vals[0], vals[1], vals[2], vals[3], vals[7]
	switch {
	case token != nil && len(token) != 16, finished != nil && len(finished) != 1,
		expires != nil && len(expires) != 8, len(now) != 8, claimed != nil && len(claimed) != 2:
		return errors.New("malformed row")
	}
	if token != nil {
		r.token = pgtype.UUID{Bytes: [16]byte(token), Valid: true}
	}
	r.finished = finished != nil && finished[0] != 0
	if expires != nil {
		// Both are microseconds since 2000-01-01, now finite, expires
		// after it (the join's condition): left > 0. expires_at may lie
		// beyond what a time.Duration holds (a lease near math.MaxInt64
		// read in the microsecond it was set, an operator's 'infinity'):
		// saturate, as time.Time.Sub does for the text format, rather
		// than let the product overflow.
		left := int64(binary.BigEndian.Uint64(expires)) - int64(binary.BigEndian.Uint64(now))
		if left > int64(math.MaxInt64/time.Microsecond) {
			r.left = math.MaxInt64
		} else {
			r.left = time.Duration(left) * time.Microsecond
		}
	}
	r.heldIdent, r.heldSums, r.response = vals[4], vals[5], vals[6]
	if claimed != nil {
		r.claimed = pgtype.Int2{Int16: int16(binary.BigEndian.Uint16(claimed)), Valid: true}
	}
	return nil
}

// scan is read for columns in text format.
func (r *claimRow) scan(rows pgx.Rows) error {
	var (
		finished pgtype.Bool
		expires  pgtype.Timestamptz
		now      time.Time
	)
	if err := rows.Scan(&r.token, &finished, &expires, &now, &r.heldIdent, &r.heldSums, &r.response, &r.claimed); err != nil {
		return err
	}
	r.finished = finished.Bool
	switch {
	case expires.InfinityModifier == pgtype.Infinity:
		r.left = math.MaxInt64 // as the binary decoding saturates it
	case expires.Valid:
		r.left = expires.Time.Sub(now)
	}
	return nil
}

// outcome is the claim's result, as the row tells it to a claim req whose
// ident is ident. What the result keeps, it copies.
func (r *claimRow) outcome(req idemgate.ClaimRequest, ident []byte) (idemgate.ClaimResult, error) {
	switch {
	case r.claimed.Valid:
		return idemgate.ClaimResult{Status: idemgate.Claimed}, nil
	case !r.token.Valid:
		return idemgate.ClaimResult{}, errors.New("neither a record nor a claim")
	case !r.finished && r.token.Bytes == req.Token:
		// A resent claim: the record holds this claim's token.
		return idemgate.ClaimResult{Status: idemgate.Claimed}, nil
	case string(r.heldIdent) != string(ident):
		var changedFields []int
		if sameScope(r.heldIdent, ident, len(req.Fingerprint)) {
			changedFields = changed(r.heldSums, req.Fields)
		}
		return idemgate.ClaimResult{Status: idemgate.Mismatch, Changed: changedFields}, nil
	case r.finished:
		resp, err := decodeResponse(bytes.Clone(r.response))
		if err != nil {
			return idemgate.ClaimResult{}, err
		}
		return idemgate.ClaimResult{Status: idemgate.Finished, Response: resp}, nil
	}
	return idemgate.ClaimResult{Status: idemgate.Running, RetryAfter: max(r.left, 0)}, nil
}

// changed returns the indexes of fields whose digests held (the record's,
// 4 bytes each) does not contain, or nil when the record holds none.
func changed(held []byte, fields []fingerprint.FieldSum) []int {
	const n = len(fingerprint.FieldSum{})
	if len(held) == 0 {
		return nil
	}
	var out []int
	for i, f := range fields {
		found := false
		for j := 0; j+n <= len(held); j += n {
			if string(held[j:j+n]) == string(f[:]) {
				found = true
				break
			}
		}
		if !found {
			out = append(out, i)
		}
	}
	return out
}

// Extend implements idemgate.Store.
func (s *Store) Extend(ctx context.Context, key string, token idemgate.Token, lease time.Duration) error {
	tag, err := s.pool.Exec(ctx, s.q.extend, key, uuid(token), micros(lease))
	if err != nil {
		return fmt.Errorf("pgrecords: extend: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return idemgate.ErrLeaseLost
	}
	return nil
}

// Complete implements idemgate.Store.
func (s *Store) Complete(ctx context.Context, key string, token idemgate.Token, resp idemgate.Response, retention time.Duration) error {
	if resp.Status < 100 || resp.Status > 999 {
		return fmt.Errorf("pgrecords: complete: status %d out of range", resp.Status)
	}
	tag, err := s.pool.Exec(ctx, s.q.complete, key, uuid(token), micros(retention), appendResponse(nil, resp))
	if err != nil {
		return fmt.Errorf("pgrecords: complete: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	// A resent complete whose first run finished the record succeeds.
	var finished bool
	err = s.pool.QueryRow(ctx, s.q.completed, key, uuid(token)).Scan(&finished)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return idemgate.ErrLeaseLost
	case err != nil:
		return fmt.Errorf("pgrecords: complete: %w", err)
	case !finished:
		// Only a lease that ran out between the two statements leaves an
		// unfinished record here; the claim is lost all the same.
		return idemgate.ErrLeaseLost
	}
	return nil
}

// Release implements idemgate.Store.
func (s *Store) Release(ctx context.Context, key string, token idemgate.Token) error {
	tag, err := s.pool.Exec(ctx, s.q.release, key, uuid(token))
	if err != nil {
		return fmt.Errorf("pgrecords: release: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return idemgate.ErrLeaseLost
	}
	return nil
}

// micros returns d in whole microseconds, rounded up, at least 1.
func micros(d time.Duration) int64 {
	if d <= 0 {
		return 1
	}
	us := int64(d / time.Microsecond)
	if d%time.Microsecond != 0 {
		us++ // not (d + 999ns) / 1µs: that overflows for d near math.MaxInt64
	}
	return us
}

// uuid is a token as a query argument. A [16]byte has no text encoding
// for a parameter of unknown type, which is what the simple protocol and
// QueryExecModeExec send; pgtype.UUID has one in every mode.
func uuid(t idemgate.Token) pgtype.UUID { return pgtype.UUID{Bytes: t, Valid: true} }

// serializationFailure reports whether err is SQLSTATE 40001.
func serializationFailure(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40001"
}
