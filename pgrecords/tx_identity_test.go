package pgrecords_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/pgstore"
)

// TestTxHandlerBeginsAnother: a handler (or a library under it) ends the
// store's transaction and begins another in one Exec (`ROLLBACK; BEGIN`,
// `COMMIT; BEGIN`). The connection is "in a transaction" again, but not
// the one the store opened: the completion must not commit the new,
// empty one together with the record (an answer stored without its
// writes: the retry would replay it). It is answered as any handler that
// broke its transaction: 500, nothing stored, the claim released (reason
// tx_aborted, no store_error), and the retry runs. A request without a key
// (no record) must not get its 201 either.
func TestTxHandlerBeginsAnother(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	var mu sync.Mutex
	var events []idemgate.Event
	e := atomicRoute(t, s, func(c echo.Context) error {
		tx := pgrecords.Tx(c)
		ctx := c.Request().Context()
		key := c.Request().Header.Get("Idempotency-Key")
		if key == "" {
			key = "keyless"
		}
		if _, err := tx.Exec(ctx, `INSERT INTO ledger (key, node) VALUES ($1, 'h')`, key); err != nil {
			return err
		}
		if c.Request().Header.Get("X-Mode") != "ok" {
			end := "ROLLBACK; BEGIN"
			if strings.Contains(key, "commit") {
				end = "COMMIT; BEGIN"
			}
			if _, err := tx.Exec(ctx, end); err != nil {
				return err
			}
		}
		return c.String(http.StatusCreated, "written")
	}, func(c *middleware.Config) {
		c.OnEvent = func(_ context.Context, ev idemgate.Event) { mu.Lock(); events = append(events, ev); mu.Unlock() }
	})
	for _, tt := range []struct {
		key      string
		wantRows int // what the handler's own COMMIT let through, before the retry
	}{
		{key: "rollback-begin", wantRows: 0},
		{key: "commit-begin", wantRows: 1},
		{key: "", wantRows: 0},
	} {
		t.Run("key="+tt.key, func(t *testing.T) {
			mu.Lock()
			events = nil
			mu.Unlock()
			rec := atomicSendMode(e, tt.key, "")
			if rec.Code != http.StatusInternalServerError {
				t.Errorf("first = %d %q, want 500 (the handler ended the store's transaction)", rec.Code, rec.Body)
			}
			ledgerKey := tt.key
			if ledgerKey == "" {
				ledgerKey = "keyless"
			}
			if got := ledgerRows(t, pool, ledgerKey); got != tt.wantRows {
				t.Errorf("ledger rows after the first = %d, want %d", got, tt.wantRows)
			}
			if tt.key == "" {
				return
			}
			mu.Lock()
			var released bool
			for _, ev := range events {
				switch {
				case ev.Type == idemgate.EventStoreError:
					t.Errorf("store_error event %s: %v", ev.Reason, ev.Err)
				case ev.Type == idemgate.EventReleased:
					released = ev.Reason == "tx_aborted"
				}
			}
			mu.Unlock()
			if !released {
				t.Errorf("events %v, want released tx_aborted", events)
			}
			retry := atomicSendMode(e, tt.key, "ok")
			if retry.Code != http.StatusCreated || retry.Header().Get("Idempotent-Replayed") == "true" {
				t.Errorf("retry = %d replayed=%q, want a run of its own", retry.Code, retry.Header().Get("Idempotent-Replayed"))
			}
			if got := ledgerRows(t, pool, tt.key); got != tt.wantRows+1 {
				t.Errorf("ledger rows after the retry = %d, want %d", got, tt.wantRows+1)
			}
		})
	}
}

// atomicSendMode is atomicSend with an X-Mode header.
func atomicSendMode(e *echo.Echo, key, mode string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{}`))
	r.Header.Set("Content-Type", "application/json")
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	if mode != "" {
		r.Header.Set("X-Mode", mode)
	}
	w := httptest.NewRecorder()
	e.ServeHTTP(w, r)
	return w
}

// TestTxHandlerTouchesTheMark: a handler that resets or overwrites the
// store's mark on its transaction (RESET ALL, its own SET LOCAL of
// idemgate.tx) cannot have the answer stored: 500 tx_aborted, nothing
// committed, the retry runs. A savepoint rolled back keeps the mark (it
// was set before): the answer commits.
func TestTxHandlerTouchesTheMark(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	e := atomicRoute(t, s, func(c echo.Context) error {
		tx := pgrecords.Tx(c)
		ctx := c.Request().Context()
		key := c.Request().Header.Get("Idempotency-Key")
		if err := ledgerInsert(ctx, tx, key, "h"); err != nil {
			return err
		}
		if c.Request().Header.Get("X-Mode") == "ok" {
			return c.String(http.StatusCreated, "written")
		}
		switch key {
		case "reset-all":
			_, err := tx.Exec(ctx, `RESET ALL`)
			if err != nil {
				return err
			}
		case "overwrite":
			if _, err := tx.Exec(ctx, `SET LOCAL idemgate.tx = 'mine'`); err != nil {
				return err
			}
		case "savepoint":
			if _, err := tx.Exec(ctx, `SAVEPOINT s; SET LOCAL idemgate.tx = 'mine'; ROLLBACK TO SAVEPOINT s`); err != nil {
				return err
			}
		}
		return c.String(http.StatusCreated, "written")
	}, nil)
	for _, tt := range []struct {
		key  string
		want int
	}{
		{"reset-all", 500},
		{"overwrite", 500},
		{"savepoint", 201},
	} {
		t.Run(tt.key, func(t *testing.T) {
			if rec := atomicSendMode(e, tt.key, ""); rec.Code != tt.want {
				t.Errorf("first = %d %q, want %d", rec.Code, rec.Body, tt.want)
			}
			wantRows := 0
			if tt.want == 201 {
				wantRows = 1
			}
			if got := ledgerRows(t, pool, tt.key); got != wantRows {
				t.Errorf("ledger rows = %d, want %d", got, wantRows)
			}
			retry := atomicSendMode(e, tt.key, "ok")
			if (tt.want == 201) != (retry.Header().Get("Idempotent-Replayed") == "true") || retry.Code != 201 {
				t.Errorf("retry = %d replayed=%q", retry.Code, retry.Header().Get("Idempotent-Replayed"))
			}
		})
	}
}

// TestTxHandlerSessionSetOutlivesRequest: a SET without LOCAL in the
// handler's transaction (search_path) is the session's once the
// transaction commits, and stays on the pool's connection after the
// request, as in any pgx pool. The store's own statements on that
// connection (the next requests' claims, completions and releases) must
// still find the records table.
func TestTxHandlerSessionSetOutlivesRequest(t *testing.T) {
	t.Parallel()
	pool, _ := atomicDB(t)
	if _, err := pool.Exec(testCtx(t), `CREATE SCHEMA tenant_a; CREATE TABLE tenant_a.ledger (key text NOT NULL, node text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	one := poolWith(t, pool.Config().ConnString(), func(c *pgxpool.Config) { c.MaxConns = 1 })
	s, err := pgrecords.New(testCtx(t), one)
	if err != nil {
		t.Fatal(err)
	}
	e := atomicRoute(t, s, func(c echo.Context) error {
		tx := pgrecords.Tx(c)
		ctx := c.Request().Context()
		if _, err := tx.Exec(ctx, `SET search_path = tenant_a`); err != nil {
			return err
		}
		if err := ledgerInsert(ctx, tx, c.Request().Header.Get("Idempotency-Key"), "h"); err != nil {
			return err
		}
		return c.String(http.StatusCreated, "written")
	}, nil)
	for i := range 3 {
		key := fmt.Sprintf("session-set-%d", i)
		if rec := atomicSendMode(e, key, ""); rec.Code != http.StatusCreated {
			t.Errorf("request %d = %d %q, want 201", i, rec.Code, rec.Body)
		}
		if again := atomicSendMode(e, key, ""); again.Header().Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry %d = %d replayed=%q %q", i, again.Code, again.Header().Get("Idempotent-Replayed"), again.Body)
		}
	}
}

// TestTxMarkNotRearmedAfterHandlerBeginsAnother: a handler writes, a
// library under it sends `ROLLBACK; BEGIN`, and then it calls, for the
// first time, a method that needs pgx's own transaction (a savepoint
// through Begin, as pgstore.SubmitTx takes one; Conn; CopyFrom; Prepare;
// large objects). The store must not send its mark again into the new,
// empty transaction: the answer would commit without the write, and the
// retry would replay it over an empty ledger. Each path is answered 500
// (the handler broke its transaction), nothing committed, and the retry
// runs the handler.
func TestTxMarkNotRearmedAfterHandlerBeginsAnother(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	tasks, err := pgstore.New(testCtx(t), pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := tasks.Migrate(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	paths := map[string]func(ctx context.Context, tx pgx.Tx) error{
		"submit-tx": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tasks.SubmitTx(ctx, tx, pgstore.NewTask{Tenant: "acme", Owner: "alice", Kind: "charge",
				Runtime: "cpu", Network: "main", IdempotencyKey: "submit-tx", Fingerprint: "f", Params: json.RawMessage(`{}`)})
			return err
		},
		"savepoint": func(ctx context.Context, tx pgx.Tx) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			return sp.Commit(ctx)
		},
		"conn": func(ctx context.Context, tx pgx.Tx) error {
			if tx.Conn() == nil {
				return errors.New("no connection")
			}
			return nil
		},
		"copy-from": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"ledger"}, []string{"key", "node"}, pgx.CopyFromRows([][]any{{"copied", "c"}}))
			return err
		},
		"prepare": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Prepare(ctx, "ledger_count", `SELECT count(*) FROM ledger`)
			return err
		},
		"large-objects": func(ctx context.Context, tx pgx.Tx) error {
			lo := tx.LargeObjects()
			_, err := lo.Create(ctx, 0)
			return err
		},
	}
	// A path that fails answers 500 on any code: each must succeed in the
	// new transaction for the test to prove anything.
	var pathErrs sync.Map
	e := atomicRoute(t, s, func(c echo.Context) error {
		tx := pgrecords.Tx(c)
		ctx := c.Request().Context()
		key := c.Request().Header.Get("Idempotency-Key")
		if err := ledgerInsert(ctx, tx, key, "h"); err != nil {
			return err
		}
		if c.Request().Header.Get("X-Mode") != "ok" {
			if _, err := tx.Exec(ctx, "ROLLBACK; BEGIN"); err != nil {
				return err
			}
			if err := paths[key](ctx, tx); err != nil {
				pathErrs.Store(key, err)
				return err
			}
		}
		return c.String(http.StatusCreated, "charged")
	}, nil)
	for key := range paths {
		t.Run(key, func(t *testing.T) {
			if rec := atomicSendMode(e, key, ""); rec.Code != http.StatusInternalServerError {
				t.Errorf("first = %d %q, want 500 (the handler's transaction was replaced)", rec.Code, rec.Body)
			}
			if err, ok := pathErrs.Load(key); ok {
				t.Fatalf("the %s path failed in the new transaction: %v", key, err)
			}
			if got := ledgerRows(t, pool, key); got != 0 {
				t.Errorf("ledger rows after the first = %d, want 0 (rolled back by the handler)", got)
			}
			retry := atomicSendMode(e, key, "ok")
			if retry.Code != http.StatusCreated || retry.Header().Get("Idempotent-Replayed") == "true" {
				t.Errorf("retry = %d replayed=%q, want a run of its own", retry.Code, retry.Header().Get("Idempotent-Replayed"))
			}
			if got := ledgerRows(t, pool, key); got != 1 {
				t.Errorf("ledger rows after the retry = %d, want 1", got)
			}
		})
	}
}
