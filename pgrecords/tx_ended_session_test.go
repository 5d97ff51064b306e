package pgrecords_test

import (
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/pgrecords"
)

// TestTxEndedByHandlerSessionNotReused: a handler ends the store's
// transaction and, outside any transaction, changes its session before
// it begins another (DISCARD ALL, as a pooler's reset sends, which drops
// the statements pgx has prepared on the connection). It is answered 500
// transaction_aborted; what it did to the session must not reach the
// requests that the pool gives the same connection next: each of them
// answers as if it had a fresh one. The pool has one connection, so
// every later claim, statement and completion runs on it.
func TestTxEndedByHandlerSessionNotReused(t *testing.T) {
	t.Parallel()
	pool, _ := atomicDB(t)
	one := poolWith(t, pool.Config().ConnString(), func(c *pgxpool.Config) { c.MaxConns = 1 })
	s, err := pgrecords.New(testCtx(t), one)
	if err != nil {
		t.Fatal(err)
	}
	e := atomicRoute(t, s, func(c echo.Context) error {
		tx := pgrecords.Tx(c)
		ctx := c.Request().Context()
		key := c.Request().Header.Get("Idempotency-Key")
		if err := ledgerInsert(ctx, tx, key, "h"); err != nil {
			return err
		}
		if c.Request().Header.Get("X-Mode") == "discard" {
			conn := tx.Conn()
			for _, sql := range []string{`ROLLBACK`, `DISCARD ALL`, `BEGIN`} {
				if _, err := conn.Exec(ctx, sql); err != nil {
					return err
				}
			}
		}
		return c.String(http.StatusCreated, "charged")
	}, nil)
	// Warm the connection's statement cache with every statement of a
	// request, then break it.
	if rec := atomicSendMode(e, "warm", ""); rec.Code != http.StatusCreated {
		t.Fatalf("warm = %d %q", rec.Code, rec.Body)
	}
	if rec := atomicSendMode(e, "discard", "discard"); rec.Code != http.StatusInternalServerError {
		t.Errorf("the handler that discarded its session = %d %q, want 500", rec.Code, rec.Body)
	}
	for _, key := range []string{"next-1", "next-2", "next-3"} {
		if rec := atomicSendMode(e, key, ""); rec.Code != http.StatusCreated {
			t.Errorf("%s after the discarding handler = %d %q, want 201", key, rec.Code, rec.Body)
		}
		if got := ledgerRows(t, pool, key); got != 1 {
			t.Errorf("%s: ledger rows = %d, want 1", key, got)
		}
	}
}
