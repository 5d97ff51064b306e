package pgrecords_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/pgrecords"
)

// TestAtomicCommitSQLStateHints: a deferred constraint trigger fails at
// the COMMIT with each class of SQLSTATE. What the client is told agrees
// with what a retry would meet: the handler's data failing (classes 22,
// 23, 42, P0, 40002) is final (x-should-retry: false, no Retry-After); a
// conflict (40001, 40P01) is 503 transaction_conflict and the server's
// trouble (55P03, 57014, 08006, 53100, XX000) 503 store_unavailable, both
// with x-should-retry: true and a Retry-After. Nothing is committed, and
// the retry (without the failing row) runs the handler and commits.
func TestAtomicCommitSQLStateHints(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	if _, err := pool.Exec(testCtx(t), `
CREATE TABLE late_fail (key text NOT NULL, code text NOT NULL);
CREATE FUNCTION late_fail() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'late_fail %', NEW.code USING ERRCODE = NEW.code;
END
$$;
CREATE CONSTRAINT TRIGGER late_fail AFTER INSERT ON late_fail DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW EXECUTE FUNCTION late_fail();`); err != nil {
		t.Fatal(err)
	}
	e := atomicRoute(t, s, func(c echo.Context) error {
		tx := pgrecords.Tx(c)
		ctx := c.Request().Context()
		key := c.Request().Header.Get("Idempotency-Key")
		if err := ledgerInsert(ctx, tx, key, "h"); err != nil {
			return err
		}
		if c.Request().Header.Get("X-Mode") != "ok" {
			code, _, _ := strings.Cut(key, "-")
			if _, err := tx.Exec(ctx, `INSERT INTO late_fail VALUES ($1, $2)`, key, code); err != nil {
				return err
			}
		}
		return c.String(http.StatusCreated, "charged")
	}, nil)
	for _, tt := range []struct {
		code   string
		status int
		retry  bool
		pcode  string // the problem's code; "" echo's error answer
	}{
		{"22012", 500, false, ""},
		{"23505", 500, false, ""},
		{"42501", 500, false, ""},
		{"P0001", 500, false, ""},
		{"40002", 500, false, ""},
		{"40001", 503, true, "transaction_conflict"},
		{"40P01", 503, true, "transaction_conflict"},
		{"55P03", 503, true, "store_unavailable"},
		{"57014", 503, true, "store_unavailable"},
		{"08006", 503, true, "store_unavailable"},
		{"53100", 503, true, "store_unavailable"},
		{"XX000", 503, true, "store_unavailable"},
	} {
		t.Run(tt.code, func(t *testing.T) {
			key := tt.code + "-late"
			rec := atomicSendMode(e, key, "")
			hint, after := rec.Header().Get("X-Should-Retry"), rec.Header().Get("Retry-After")
			if rec.Code != tt.status || hint != map[bool]string{true: "true", false: "false"}[tt.retry] || (after != "") != tt.retry {
				t.Errorf("first = %d x-should-retry=%q Retry-After=%q, want %d %v with a Retry-After exactly when retrying",
					rec.Code, hint, after, tt.status, tt.retry)
			}
			if tt.pcode != "" && !strings.Contains(rec.Body.String(), `"code":"`+tt.pcode+`"`) {
				t.Errorf("first = %q, want problem %s", rec.Body, tt.pcode)
			}
			if got := ledgerRows(t, pool, key); got != 0 {
				t.Errorf("ledger rows after the refused commit = %d, want 0", got)
			}
			retry := atomicSendMode(e, key, "ok")
			if retry.Code != http.StatusCreated || retry.Header().Get("Idempotent-Replayed") == "true" {
				t.Errorf("retry = %d replayed=%q %q, want a run of its own", retry.Code, retry.Header().Get("Idempotent-Replayed"), retry.Body)
			}
			if got := ledgerRows(t, pool, key); got != 1 {
				t.Errorf("ledger rows after the retry = %d, want 1", got)
			}
		})
	}
}
