package pgstore

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The SQLSTATE codes the package acts on. This file is the one place
// that reads them.
const (
	codeUniqueViolation    = "23505" // a unique index refused a row
	codeNoConflictTarget   = "42P10" // ON CONFLICT names no valid unique index (v1, or v2 mid-build)
	codeUndefinedColumn    = "42703" // a statement names a column the schema lacks (key_digest before v12)
	codeUndefinedTable     = "42P01"
	codeInvalidText        = "22P02" // Params is not JSON
	codeUntranslatableChar = "22P05" // \u0000 in jsonb
	codeCharNotInRepertory = "22021" // NUL or invalid UTF-8 in text
	// codeSerializationFailure: under REPEATABLE READ or SERIALIZABLE, a
	// row a concurrent transaction committed after the statement's
	// snapshot conflicts with the statement's (a held key).
	codeSerializationFailure = "40001"
)

// sqlState returns err's SQLSTATE, or "" when the server did not answer
// with an error (network, timeout, closed connection).
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// isUniqueViolation reports whether err is a unique violation on one of
// the named indexes.
func isUniqueViolation(err error, indexes ...string) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != codeUniqueViolation {
		return false
	}
	for _, name := range indexes {
		if pgErr.ConstraintName == name {
			return true
		}
	}
	return false
}

// transient reports whether a failed statement may succeed when run
// again: the connection or the server failed, not the statement.
func transient(err error) bool {
	if errors.Is(err, errWorkerStopped) {
		return false
	}
	code := sqlState(err)
	if code == "" {
		return true // network, timeout, connection closed
	}
	switch code[:2] {
	case "08", // connection exception
		"40", // transaction rollback: serialization failure, deadlock
		"53", // insufficient resources: too many connections, out of memory
		"57", // operator intervention: shutdown, cannot connect now, canceled
		"58": // system error
		return true
	}
	return false
}

// interpretError wraps a database error for the operation op.
func interpretError(op string, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	switch sqlState(err) {
	case codeUndefinedTable:
		return fmt.Errorf("pgstore: %s: schema missing (run Migrate): %w", op, err)
	case codeInvalidText:
		return fmt.Errorf("pgstore: %s: params: %w", op, err)
	case codeUntranslatableChar, codeCharNotInRepertory:
		return fmt.Errorf("pgstore: %s: text Postgres cannot store: %w", op, err)
	}
	return fmt.Errorf("pgstore: %s: %w", op, err)
}
