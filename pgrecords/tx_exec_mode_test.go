package pgrecords_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/pgrecords"
)

// TestTxFirstStatementWithExecMode: pgx takes a query exec mode as a
// statement's first argument (pgx.QueryExecModeSimpleProtocol, which a
// pool behind PgBouncer's transaction mode uses, QueryExecModeExec, …).
// As the handler's first statement, as in a plain pgx transaction, the
// statement runs in that mode and its write commits with the answer.
func TestTxFirstStatementWithExecMode(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	ins := `INSERT INTO ledger (key, node) VALUES ($1, 'h')`
	paths := map[string]func(ctx context.Context, tx pgx.Tx, key string) error{
		"exec-simple-protocol": func(ctx context.Context, tx pgx.Tx, key string) error {
			_, err := tx.Exec(ctx, ins, pgx.QueryExecModeSimpleProtocol, key)
			return err
		},
		"exec-simple-protocol-multi": func(ctx context.Context, tx pgx.Tx, key string) error {
			_, err := tx.Exec(ctx, fmt.Sprintf(`SELECT 1; INSERT INTO ledger (key, node) VALUES ('%s', 'h')`, key), pgx.QueryExecModeSimpleProtocol)
			return err
		},
		"exec-exec": func(ctx context.Context, tx pgx.Tx, key string) error {
			_, err := tx.Exec(ctx, ins, pgx.QueryExecModeExec, key)
			return err
		},
		"exec-describe": func(ctx context.Context, tx pgx.Tx, key string) error {
			_, err := tx.Exec(ctx, ins, pgx.QueryExecModeDescribeExec, key)
			return err
		},
		"query-simple-protocol": func(ctx context.Context, tx pgx.Tx, key string) error {
			var n int
			return tx.QueryRow(ctx, ins+` RETURNING 1`, pgx.QueryExecModeSimpleProtocol, key).Scan(&n)
		},
		"query-exec": func(ctx context.Context, tx pgx.Tx, key string) error {
			var n int
			return tx.QueryRow(ctx, ins+` RETURNING 1`, pgx.QueryExecModeExec, key).Scan(&n)
		},
	}
	e := atomicRoute(t, s, func(c echo.Context) error {
		key := c.Request().Header.Get("Idempotency-Key")
		if err := paths[key](c.Request().Context(), pgrecords.Tx(c), key); err != nil {
			return err
		}
		return c.String(http.StatusCreated, "charged")
	}, nil)
	for key := range paths {
		t.Run(key, func(t *testing.T) {
			if rec := atomicSendMode(e, key, ""); rec.Code != http.StatusCreated {
				t.Errorf("first = %d %q, want 201", rec.Code, rec.Body)
			}
			if rec := atomicSendMode(e, key, ""); rec.Header().Get("Idempotent-Replayed") != "true" {
				t.Errorf("retry = %d %q, want the stored answer", rec.Code, rec.Body)
			}
			if got := ledgerRows(t, pool, key); got != 1 {
				t.Errorf("ledger rows = %d, want 1", got)
			}
		})
	}
}
