package pgrecords_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/pgrecords"
)

// TestTxAnswerNeverStoredWithoutItsWrites: a handler writes a ledger row
// and then, by one of the ways SQL has, ends the store's transaction and
// goes on in another (or in none), ignores every error it gets and
// answers 201. Whatever it did, an answer that is stored (the retry
// replays it) or that reaches the client as 2xx must have its write
// committed: never a replayed "charged" over an empty ledger. An answer
// that is not stored is 500 transaction_aborted, not to be retried.
func TestTxAnswerNeverStoredWithoutItsWrites(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	ins := func(key string) string {
		return fmt.Sprintf(`INSERT INTO ledger (key, node) VALUES ('%s', 'h')`, key)
	}
	// Each attack gets the key; it runs as the handler's first statement
	// and writes the row itself, or after ledgerInsert when later.
	attacks := []struct {
		name  string
		later bool // ledgerInsert first
		run   func(ctx context.Context, tx pgx.Tx, key string)
	}{
		{name: "first-rollback-then-analysis-error", run: func(ctx context.Context, tx pgx.Tx, key string) {
			// INSERT with more values than columns is 42601, raised when
			// the statement is analysed, after ROLLBACK ran.
			_, _ = tx.Exec(ctx, ins(key)+`; ROLLBACK; INSERT INTO ledger (key) VALUES ('x', 'y')`)
		}},
		{name: "first-rollback-then-do-syntax-error", run: func(ctx context.Context, tx pgx.Tx, key string) {
			_, _ = tx.Exec(ctx, ins(key)+`; ROLLBACK; DO $$ BEGIN EXECUTE 'selec 1'; END $$`)
		}},
		{name: "first-rollback-and-chain", run: func(ctx context.Context, tx pgx.Tx, key string) {
			_, _ = tx.Exec(ctx, ins(key)+`; ROLLBACK AND CHAIN`)
		}},
		{name: "first-commit-then-analysis-error", run: func(ctx context.Context, tx pgx.Tx, key string) {
			_, _ = tx.Exec(ctx, ins(key)+`; COMMIT; INSERT INTO ledger (key) VALUES ('x', 'y')`)
		}},
		{name: "commit-and-chain", later: true, run: func(ctx context.Context, tx pgx.Tx, _ string) {
			_, _ = tx.Exec(ctx, `COMMIT AND CHAIN`)
		}},
		{name: "savepoint-release", later: true, run: func(ctx context.Context, tx pgx.Tx, _ string) {
			_, _ = tx.Exec(ctx, `SAVEPOINT a; ROLLBACK TO SAVEPOINT a; RELEASE SAVEPOINT a`)
		}},
		{name: "first-batch-rollback-begin", run: func(ctx context.Context, tx pgx.Tx, key string) {
			b := &pgx.Batch{}
			b.Queue(ins(key))
			b.Queue(`ROLLBACK`)
			b.Queue(`BEGIN`)
			_ = tx.SendBatch(ctx, b).Close()
		}},
		{name: "rollback-and-chain", later: true, run: func(ctx context.Context, tx pgx.Tx, _ string) {
			_, _ = tx.Exec(ctx, `ROLLBACK AND CHAIN`)
		}},
		{name: "end-start-transaction", later: true, run: func(ctx context.Context, tx pgx.Tx, _ string) {
			_, _ = tx.Exec(ctx, `ABORT; START TRANSACTION ISOLATION LEVEL SERIALIZABLE`)
		}},
		{name: "batch-rollback-begin", later: true, run: func(ctx context.Context, tx pgx.Tx, _ string) {
			b := &pgx.Batch{}
			b.Queue(`ROLLBACK`)
			b.Queue(`BEGIN`)
			_ = tx.SendBatch(ctx, b).Close()
		}},
		{name: "rollback-then-analysis-error", later: true, run: func(ctx context.Context, tx pgx.Tx, _ string) {
			_, _ = tx.Exec(ctx, `ROLLBACK; INSERT INTO ledger (key) VALUES ('x', 'y')`)
		}},
		{name: "conn-rollback-begin", later: true, run: func(ctx context.Context, tx pgx.Tx, _ string) {
			conn := tx.Conn()
			_, _ = conn.Exec(ctx, `ROLLBACK`)
			_, _ = conn.Exec(ctx, `BEGIN`)
		}},
		{name: "do-rollback", later: true, run: func(ctx context.Context, tx pgx.Tx, _ string) {
			_, _ = tx.Exec(ctx, `DO $$ BEGIN ROLLBACK; END $$`)
		}},
		{name: "set-transaction-late", later: true, run: func(ctx context.Context, tx pgx.Tx, _ string) {
			_, _ = tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL SERIALIZABLE`)
		}},
	}
	byName := map[string]func(ctx context.Context, tx pgx.Tx, key string){}
	later := map[string]bool{}
	for _, a := range attacks {
		byName[a.name], later[a.name] = a.run, a.later
	}
	e := atomicRoute(t, s, func(c echo.Context) error {
		tx := pgrecords.Tx(c)
		ctx := c.Request().Context()
		key := c.Request().Header.Get("Idempotency-Key")
		if c.Request().Header.Get("X-Mode") == "ok" || later[key] {
			if err := ledgerInsert(ctx, tx, key, "h"); err != nil {
				return err
			}
		}
		if c.Request().Header.Get("X-Mode") != "ok" {
			byName[key](ctx, tx, key)
		}
		return c.String(http.StatusCreated, "charged")
	}, nil)
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			first := atomicSendMode(e, a.name, "")
			rowsFirst := ledgerRows(t, pool, a.name)
			if first.Code/100 == 2 && rowsFirst == 0 {
				t.Errorf("first = %d %q with 0 ledger rows: an answer whose write is gone", first.Code, first.Body)
			}
			if first.Code/100 != 2 && (first.Code != http.StatusInternalServerError || first.Header().Get("X-Should-Retry") != "false" ||
				!strings.Contains(first.Body.String(), `"code":"transaction_aborted"`)) {
				t.Errorf("first = %d x-should-retry=%q %q, want 500 transaction_aborted, not to be retried",
					first.Code, first.Header().Get("X-Should-Retry"), first.Body)
			}
			retry := atomicSendMode(e, a.name, "ok")
			rows := ledgerRows(t, pool, a.name)
			replayed := retry.Header().Get("Idempotent-Replayed") == "true"
			if replayed && rowsFirst == 0 {
				t.Errorf("first = %d %q, retry replayed %d %q over an empty ledger", first.Code, first.Body, retry.Code, retry.Body)
			}
			if !replayed && rows != rowsFirst+1 {
				t.Errorf("retry = %d ran, ledger rows %d → %d", retry.Code, rowsFirst, rows)
			}
			t.Logf("first %d, rows %d; retry %d replayed=%v, rows %d", first.Code, rowsFirst, retry.Code, replayed, rows)
		})
	}
}
