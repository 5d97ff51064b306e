package pgrecords

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
)

var _ idemgate.Inspector = (*Store)(nil)

const (
	// sqlInspect reads the live record under a key, with the time left
	// on it by the database's clock.
	// Microseconds left, saturated for an operator's 'infinity'.
	sqlInspect = `SELECT token, finished,
	(LEAST(EXTRACT(epoch FROM expires_at) OPERATOR(pg_catalog.-) EXTRACT(epoch FROM pg_catalog.now()), 9e12)
		OPERATOR(pg_catalog.*) 1e6)::pg_catalog.int8,
	ident, pg_catalog.octet_length(sums), response,
	16 OPERATOR(pg_catalog.+) pg_catalog.octet_length(ident) OPERATOR(pg_catalog.+) COALESCE(pg_catalog.octet_length(sums), 0)
		OPERATOR(pg_catalog.+) COALESCE(pg_catalog.octet_length(response), 0)
FROM idemgate_records
WHERE key OPERATOR(pg_catalog.=) $1::pg_catalog.text AND expires_at OPERATOR(pg_catalog.>) pg_catalog.now()`

	// sqlForget deletes the live record under a key if it holds the token
	// in the state asked: the operator's release, fenced like sqlRelease.
	sqlForget = `DELETE FROM idemgate_records
WHERE key OPERATOR(pg_catalog.=) $1::pg_catalog.text AND token OPERATOR(pg_catalog.=) $2::pg_catalog.uuid
	AND finished OPERATOR(pg_catalog.=) $3::pg_catalog.bool AND expires_at OPERATOR(pg_catalog.>) pg_catalog.now()`
)

// Inspect implements idemgate.Inspector.
func (s *Store) Inspect(ctx context.Context, key string) (idemgate.RecordInfo, error) {
	var (
		info     idemgate.RecordInfo
		token    pgtype.UUID
		left     int64 // microseconds
		ident    []byte
		sums     *int
		response []byte
	)
	err := s.pool.QueryRow(ctx, s.q.inspect, key).Scan(&token, &info.Finished, &left, &ident, &sums, &response, &info.Size)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return idemgate.RecordInfo{}, idemgate.ErrNoRecord
	case err != nil:
		return idemgate.RecordInfo{}, fmt.Errorf("pgrecords: inspect: %w", err)
	}
	info.Token, info.Left = token.Bytes, time.Duration(left)*time.Microsecond
	info.ClaimedAt, info.Lease, _ = info.Token.ClaimTimes()
	if sums != nil {
		info.Fields = *sums / len(fingerprint.FieldSum{})
	}
	d := reader{b: ident}
	oFrom, oTo := d.str()
	kFrom, kTo := d.str()
	if d.err {
		return idemgate.RecordInfo{}, fmt.Errorf("pgrecords: inspect: %w", errCorrupt)
	}
	info.Owner, info.Kind, info.Fingerprint = string(ident[oFrom:oTo]), string(ident[kFrom:kTo]), string(ident[d.i:])
	if info.Finished {
		resp, err := decodeResponse(response)
		if err != nil {
			return idemgate.RecordInfo{}, fmt.Errorf("pgrecords: inspect: %w", err)
		}
		info.Status, info.Header, info.BodySize = resp.Status, resp.Header, len(resp.Body)
	}
	return info, nil
}

// Forget implements idemgate.Inspector.
func (s *Store) Forget(ctx context.Context, key string, token idemgate.Token, finished bool) error {
	tag, err := s.pool.Exec(ctx, s.q.forget, key, uuid(token), finished)
	if err != nil {
		return fmt.Errorf("pgrecords: forget: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return idemgate.ErrNoRecord
	}
	return nil
}
