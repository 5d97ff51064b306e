package pgrecords

import (
	"errors"
	"testing"

	"github.com/idemgate/idemgate"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestCommitErrorClassification: what a failed COMMIT that the server
// answered is, by SQLSTATE. The handler's data failing what runs at
// COMMIT (a deferred constraint or trigger: classes 22, 23, 42, P0,
// 40002) fails on every retry: ErrTxRefused, final. A concurrent
// transaction's doing (40001, 40P01) may pass on a retry: ErrTxConflict.
// The server's trouble or state of the moment (a connection, resources,
// a lock, a cancellation, a shutdown, I/O, an internal error) and any
// error the server did not answer, or answered FATAL, are the store's:
// neither, answered store_unavailable with a retry.
func TestCommitErrorClassification(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		given error
		want  error // nil: the store's
	}{
		{name: "division by zero in a deferred trigger", given: &pgconn.PgError{Severity: "ERROR", Code: "22012"}, want: idemgate.ErrTxRefused},
		{name: "value out of range", given: &pgconn.PgError{Severity: "ERROR", Code: "22003"}, want: idemgate.ErrTxRefused},
		{name: "deferred foreign key", given: &pgconn.PgError{Severity: "ERROR", Code: "23503"}, want: idemgate.ErrTxRefused},
		{name: "trigger raised", given: &pgconn.PgError{Severity: "ERROR", Code: "P0001"}, want: idemgate.ErrTxRefused},
		{name: "trigger lacks a right", given: &pgconn.PgError{Severity: "ERROR", Code: "42501"}, want: idemgate.ErrTxRefused},
		{name: "transaction integrity constraint", given: &pgconn.PgError{Severity: "ERROR", Code: "40002"}, want: idemgate.ErrTxRefused},
		{name: "index row too large", given: &pgconn.PgError{Severity: "ERROR", Code: "54000"}, want: idemgate.ErrTxRefused},
		{name: "serialization failure", given: &pgconn.PgError{Severity: "ERROR", Code: "40001"}, want: idemgate.ErrTxConflict},
		{name: "deadlock", given: &pgconn.PgError{Severity: "ERROR", Code: "40P01"}, want: idemgate.ErrTxConflict},
		{name: "statement completion unknown", given: &pgconn.PgError{Severity: "ERROR", Code: "40003"}},
		{name: "lock not available", given: &pgconn.PgError{Severity: "ERROR", Code: "55P03"}},
		{name: "query canceled", given: &pgconn.PgError{Severity: "ERROR", Code: "57014"}},
		{name: "disk full", given: &pgconn.PgError{Severity: "ERROR", Code: "53100"}},
		{name: "I/O error", given: &pgconn.PgError{Severity: "ERROR", Code: "58030"}},
		{name: "internal error", given: &pgconn.PgError{Severity: "ERROR", Code: "XX000"}},
		{name: "connection failure", given: &pgconn.PgError{Severity: "ERROR", Code: "08006"}},
		{name: "admin shutdown, FATAL", given: &pgconn.PgError{Severity: "FATAL", Code: "57P01"}},
		{name: "data error, but FATAL", given: &pgconn.PgError{Severity: "FATAL", Code: "22012"}},
		{name: "not the server's answer", given: errors.New("connection reset by peer")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := commitError(tt.given)
			for _, sentinel := range []error{idemgate.ErrTxRefused, idemgate.ErrTxConflict} {
				if errors.Is(got, sentinel) != (sentinel == tt.want) {
					t.Errorf("commitError(%v) = %v; errors.Is(%v) = %v", tt.given, got, sentinel, !(sentinel == tt.want))
				}
			}
			if !errors.Is(got, tt.given) {
				t.Errorf("commitError(%v) = %v, which does not wrap the server's error", tt.given, got)
			}
		})
	}
}
