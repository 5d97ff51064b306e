package pgrecords

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/middleware"
)

var _ middleware.Inspector = (*Store)(nil)

const (
	// sqlInspect reads the live record under a key, with the time left
	// on it by the database's clock.
	// Microseconds left, saturated for an operator's 'infinity'.
	sqlInspect = `SELECT token, finished,
	(least(extract(epoch FROM expires_at) - extract(epoch FROM now()), 9e12) * 1e6)::bigint,
	ident, octet_length(sums), response,
	16 + octet_length(ident) + coalesce(octet_length(sums), 0) + coalesce(octet_length(response), 0)
FROM idemgate_records WHERE key = $1 AND expires_at > now()`

	// sqlForget deletes the live record under a key if it holds the token
	// in the state asked: the operator's release, fenced like sqlRelease.
	sqlForget = `DELETE FROM idemgate_records
WHERE key = $1 AND token = $2 AND finished = $3 AND expires_at > now()`
)

// Inspect implements middleware.Inspector.
func (s *Store) Inspect(ctx context.Context, key string) (middleware.RecordInfo, error) {
	var (
		info     middleware.RecordInfo
		token    pgtype.UUID
		left     int64 // microseconds
		ident    []byte
		sums     *int
		response []byte
	)
	err := s.pool.QueryRow(ctx, sqlInspect, key).Scan(&token, &info.Finished, &left, &ident, &sums, &response, &info.Size)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return middleware.RecordInfo{}, middleware.ErrNoRecord
	case err != nil:
		return middleware.RecordInfo{}, fmt.Errorf("pgrecords: inspect: %w", err)
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
		return middleware.RecordInfo{}, fmt.Errorf("pgrecords: inspect: %w", errCorrupt)
	}
	info.Owner, info.Kind, info.Fingerprint = string(ident[oFrom:oTo]), string(ident[kFrom:kTo]), string(ident[d.i:])
	if info.Finished {
		resp, err := decodeResponse(response)
		if err != nil {
			return middleware.RecordInfo{}, fmt.Errorf("pgrecords: inspect: %w", err)
		}
		info.Status, info.Header, info.BodySize = resp.Status, resp.Header, len(resp.Body)
	}
	return info, nil
}

// Forget implements middleware.Inspector.
func (s *Store) Forget(ctx context.Context, key string, token middleware.Token, finished bool) error {
	tag, err := s.pool.Exec(ctx, sqlForget, key, uuid(token), finished)
	if err != nil {
		return fmt.Errorf("pgrecords: forget: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return middleware.ErrNoRecord
	}
	return nil
}
