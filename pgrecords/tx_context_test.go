package pgrecords_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
)

// TestTxFromContext: on an Atomic route the request's context, and any
// context made from it (code below the handler), carries the transaction
// (TxFromContext answers it), and what the handler writes through
// it commits with the answer; on a route that is not Atomic, and on a
// context of no request, TxFromContext answers nil.
func TestTxFromContext(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	if tx := pgrecords.TxFromContext(context.Background()); tx != nil {
		t.Errorf("TxFromContext(context.Background()) = %v; want nil", tx)
	}
	type below struct{}
	tests := []struct {
		name     string
		given    bool // the route is Atomic
		wantOK   bool
		wantRows int
	}{
		{name: "atomic route", given: true, wantOK: true, wantRows: 1},
		{name: "route that is not atomic", given: false, wantOK: false, wantRows: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "txfromcontext-" + strings.ReplaceAll(tt.name, " ", "-")
			var handlerOK, belowOK, same bool
			e := echo.New()
			e.POST("/", func(c echo.Context) error {
				ctx := c.Request().Context()
				tx := pgrecords.TxFromContext(ctx)
				handlerOK = tx != nil
				under := pgrecords.TxFromContext(context.WithValue(ctx, below{}, 1))
				belowOK, same = under != nil, under == tx
				if handlerOK {
					if _, err := tx.Exec(ctx, `INSERT INTO ledger (key, node) VALUES ($1, 'h')`, key); err != nil {
						return err
					}
				}
				return c.NoContent(http.StatusNoContent)
			}, middleware.New(middleware.Config{Store: s, Scope: func(echo.Context) (string, string, error) { return "t", "u", nil }, Atomic: tt.given}))
			r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("x"))
			r.Header.Set("Idempotency-Key", key)
			w := httptest.NewRecorder()
			e.ServeHTTP(w, r)
			if w.Code != http.StatusNoContent {
				t.Fatalf("status = %d %s, want 204", w.Code, w.Body)
			}
			if handlerOK != tt.wantOK || belowOK != tt.wantOK || !same {
				t.Errorf("TxFromContext in the handler: ok %v, below it: ok %v, same tx %v; want ok %v both, the same tx", handlerOK, belowOK, same, tt.wantOK)
			}
			if got := ledgerRows(t, pool, key); got != tt.wantRows {
				t.Errorf("ledger rows = %d, want %d", got, tt.wantRows)
			}
		})
	}
}
