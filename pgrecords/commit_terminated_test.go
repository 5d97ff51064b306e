package pgrecords_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/internal/wait"
	"github.com/idemgate/idemgate/pgrecords"
)

// TestAtomicBackendTerminatedBeforeCommit: the server ends the session of
// the handler's transaction (pg_terminate_backend, an administrator or a
// failover) after the handler wrote and answered but before its commit,
// or while the COMMIT runs (a deferred trigger still busy). The write is
// rolled back with the session: the client never gets the 2xx, it gets a
// 503 that says to retry (x-should-retry: true, Retry-After), and the
// retry runs the handler once more, commits, and is replayed after.
func TestAtomicBackendTerminatedBeforeCommit(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	if _, err := pool.Exec(testCtx(t), `
CREATE TABLE slow_commit (key text NOT NULL);
CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_sleep(60);
	RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON slow_commit DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW EXECUTE FUNCTION slow_commit();`); err != nil {
		t.Fatal(err)
	}
	terminate := func(pid int) {
		if _, err := pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid); err != nil {
			t.Errorf("terminate: %v", err)
		}
	}
	e := atomicRoute(t, s, func(c echo.Context) error {
		tx := pgrecords.Tx(c)
		ctx := c.Request().Context()
		key := c.Request().Header.Get("Idempotency-Key")
		if err := ledgerInsert(ctx, tx, key, "h"); err != nil {
			return err
		}
		if c.Request().Header.Get("X-Mode") == "ok" {
			return c.String(http.StatusCreated, "charged")
		}
		var pid int
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return err
		}
		switch key {
		case "before-commit":
			terminate(pid)
			// The session is gone once the server says so.
			wait.Until(10*time.Second, func() bool {
				var n int
				_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n)
				return n == 0
			})
		case "during-commit":
			if _, err := tx.Exec(ctx, `INSERT INTO slow_commit VALUES ($1)`, key); err != nil {
				return err
			}
			go func() {
				// Ended once the COMMIT's deferred trigger sleeps.
				wait.Until(30*time.Second, func() bool {
					var n int
					_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
						WHERE pid = $1 AND wait_event = 'PgSleep'`, pid).Scan(&n)
					return n == 1
				})
				terminate(pid)
			}()
		}
		return c.String(http.StatusCreated, "charged")
	}, nil)
	for _, key := range []string{"before-commit", "during-commit"} {
		t.Run(key, func(t *testing.T) {
			first := atomicSendMode(e, key, "")
			if first.Code/100 == 2 {
				t.Errorf("first = %d %q, want no 2xx: the session ended before its commit", first.Code, first.Body)
			}
			if first.Code != http.StatusServiceUnavailable || first.Header().Get("X-Should-Retry") != "true" || first.Header().Get("Retry-After") == "" {
				t.Errorf("first = %d x-should-retry=%q Retry-After=%q %q, want 503 true with a Retry-After",
					first.Code, first.Header().Get("X-Should-Retry"), first.Header().Get("Retry-After"), first.Body)
			}
			if got := ledgerRows(t, pool, key); got != 0 {
				t.Errorf("ledger rows after the first = %d, want 0", got)
			}
			retry := atomicSendMode(e, key, "ok")
			if retry.Code != http.StatusCreated || retry.Header().Get("Idempotent-Replayed") == "true" {
				t.Errorf("retry = %d replayed=%q %q, want a run of its own", retry.Code, retry.Header().Get("Idempotent-Replayed"), retry.Body)
			}
			if again := atomicSendMode(e, key, "ok"); again.Header().Get("Idempotent-Replayed") != "true" {
				t.Errorf("second retry = %d %q, want the stored answer", again.Code, again.Body)
			}
			if got := ledgerRows(t, pool, key); got != 1 {
				t.Errorf("ledger rows after the retries = %d, want 1", got)
			}
		})
	}
}
