package pgrecords_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/proxy"
	"github.com/idemgate/idemgate/internal/wait"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
)

// commitFailureDDL: a foreign key checked at COMMIT (what Django creates
// for every ForeignKey), two tables for a write skew under SERIALIZABLE,
// a constraint trigger that takes an advisory lock at COMMIT (to
// deadlock there), and one that refuses every row at COMMIT.
const commitFailureDDL = `
CREATE TABLE parent (id int PRIMARY KEY);
CREATE TABLE child (key text NOT NULL, parent_id int NOT NULL REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);
CREATE TABLE skew_a (key text NOT NULL);
CREATE TABLE skew_b (key text NOT NULL);
CREATE TABLE late_lock (key text NOT NULL);
CREATE FUNCTION late_lock() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_advisory_xact_lock(2);
	RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER late_lock AFTER INSERT ON late_lock DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW EXECUTE FUNCTION late_lock();
CREATE TABLE late_check (key text NOT NULL);
CREATE FUNCTION late_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'late_check refuses %', NEW.key;
END
$$;
CREATE CONSTRAINT TRIGGER late_check AFTER INSERT ON late_check DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW EXECUTE FUNCTION late_check();
CREATE TABLE late_ratio (key text NOT NULL, part int NOT NULL, whole int NOT NULL);
CREATE FUNCTION late_ratio() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM NEW.part / NEW.whole;
	RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER late_ratio AFTER INSERT ON late_ratio DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW EXECUTE FUNCTION late_ratio();
`

// pgxTxSerializable opens a SERIALIZABLE transaction.
var pgxTxSerializable = pgx.TxOptions{IsoLevel: pgx.Serializable}

// TestAtomicCommitFailures: the database refuses the COMMIT, or the
// completion in front of it, with the outcome known (rolled back). An
// integrity error (a deferred foreign key), a deferred constraint
// trigger that raises, or one that fails on the handler's data (22012,
// division by zero: a data exception, which fails the same way on every
// retry) is the handler's failure: echo's error answer with
// x-should-retry: false, the claim released with reason commit_refused,
// no store_error. A serialization failure or a deadlock may succeed when
// retried: 503 transaction_conflict with x-should-retry: true and
// Retry-After, the claim released with reason commit_conflict, no
// store_error. The retry runs the handler again in every case (nothing
// was stored), and commits once nothing stands in its way.
func TestAtomicCommitFailures(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	if _, err := pool.Exec(testCtx(t), commitFailureDDL); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var events []idemgate.Event
	interfere := map[string]func(ctx context.Context, key string){
		// Another serializable transaction reads what the handler writes
		// and writes what it read, and commits first.
		"serialization": func(ctx context.Context, key string) {
			tx, err := pool.BeginTx(ctx, pgxTxSerializable)
			if err != nil {
				t.Error(err)
				return
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, `SELECT count(*) FROM skew_b`); err != nil {
				t.Error(err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO skew_a VALUES ($1)`, key); err != nil {
				t.Error(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Error(err)
			}
		},
		// Another transaction holds the lock the COMMIT's trigger takes,
		// and waits for one the handler holds (with a long deadlock_timeout,
		// so that the handler's COMMIT is the one to find the deadlock).
		"deadlock": func(ctx context.Context, key string) {
			conn, err := pool.Acquire(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			tx, err := conn.Begin(ctx)
			if err == nil {
				_, err = tx.Exec(ctx, `SET LOCAL deadlock_timeout = '60s'; SELECT pg_advisory_xact_lock(2)`)
			}
			if err != nil {
				t.Error(err)
				conn.Release()
				return
			}
			go func() {
				_, _ = tx.Exec(ctx, `SELECT pg_advisory_xact_lock(1)`)
				_ = tx.Rollback(ctx)
				conn.Release()
			}()
			wait.Until(30*time.Second, func() bool {
				var n int
				_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&n)
				return n > 0
			})
		},
	}
	e := atomicRoute(t, s, func(c echo.Context) error {
		tx := pgrecords.Tx(c)
		ctx := c.Request().Context()
		key := c.Request().Header.Get("Idempotency-Key")
		retry := c.Request().Header.Get("X-Mode") == "retry"
		switch {
		case strings.HasPrefix(key, "foreign-key"):
			if retry {
				if _, err := tx.Exec(ctx, `INSERT INTO parent VALUES (1)`); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO child VALUES ($1, 1)`, key); err != nil {
				return err
			}
		case strings.HasPrefix(key, "serialization"):
			if _, err := tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL SERIALIZABLE`); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `SELECT count(*) FROM skew_a`); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO skew_b VALUES ($1)`, key); err != nil {
				return err
			}
		case strings.HasPrefix(key, "deferred-trigger"):
			if !retry {
				if _, err := tx.Exec(ctx, `INSERT INTO late_check VALUES ($1)`, key); err != nil {
					return err
				}
			}
		case strings.HasPrefix(key, "deferred-division"):
			whole := 0
			if retry {
				whole = 4
			}
			if _, err := tx.Exec(ctx, `INSERT INTO late_ratio VALUES ($1, 1, $2)`, key, whole); err != nil {
				return err
			}
		case strings.HasPrefix(key, "deadlock"):
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(1)`); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO late_lock VALUES ($1)`, key); err != nil {
				return err
			}
		}
		if !retry {
			for name, f := range interfere {
				if strings.HasPrefix(key, name) {
					defer f(context.WithoutCancel(ctx), key)
				}
			}
		}
		return c.String(http.StatusCreated, "written")
	}, func(c *middleware.Config) {
		c.OnEvent = func(_ context.Context, ev idemgate.Event) { mu.Lock(); events = append(events, ev); mu.Unlock() }
	})
	for _, tt := range []struct {
		key        string
		wantStatus int
		wantRetry  string // Retry-After
		wantReason string
	}{
		{key: "foreign-key", wantStatus: 500, wantReason: "commit_refused"},
		{key: "deferred-trigger", wantStatus: 500, wantReason: "commit_refused"},
		{key: "deferred-division", wantStatus: 500, wantReason: "commit_refused"},
		{key: "serialization", wantStatus: 503, wantRetry: "1", wantReason: "commit_conflict"},
		{key: "deadlock", wantStatus: 503, wantRetry: "1", wantReason: "commit_conflict"},
	} {
		t.Run(tt.key, func(t *testing.T) {
			mu.Lock()
			events = nil
			mu.Unlock()
			first := atomicSendMode(e, tt.key, "")
			if first.Code != tt.wantStatus || first.Header().Get("Retry-After") != tt.wantRetry ||
				strings.Contains(first.Body.String(), "store_unavailable") || strings.Contains(first.Body.String(), "written") {
				t.Errorf("first = %d Retry-After=%q %q, want %d Retry-After=%q", first.Code, first.Header().Get("Retry-After"),
					first.Body, tt.wantStatus, tt.wantRetry)
			}
			if got, want := first.Header().Get("X-Should-Retry"), strconv.FormatBool(tt.wantRetry != ""); got != want {
				t.Errorf("first: x-should-retry %q, want %q", got, want)
			}
			if tt.wantRetry != "" && !strings.Contains(first.Body.String(), `"code":"transaction_conflict"`) {
				t.Errorf("first = %q, want a transaction_conflict problem", first.Body)
			}
			mu.Lock()
			var reasons []string
			for _, ev := range events {
				switch ev.Type {
				case idemgate.EventStoreError, idemgate.EventLeaseLost:
					t.Errorf("%v event %s: %v", ev.Type, ev.Reason, ev.Err)
				case idemgate.EventReleased:
					reasons = append(reasons, ev.Reason)
				}
			}
			mu.Unlock()
			if strings.Join(reasons, ",") != tt.wantReason {
				t.Errorf("released %v, want [%s]", reasons, tt.wantReason)
			}
			retry := atomicSendMode(e, tt.key, "retry")
			if retry.Code != http.StatusCreated || retry.Header().Get("Idempotent-Replayed") != "" {
				t.Errorf("retry = %d replayed=%q %q, want a run that commits", retry.Code, retry.Header().Get("Idempotent-Replayed"), retry.Body)
			}
		})
	}
}

// TestAtomicCommitOutcomeUnknown: the link to the database breaks while
// the COMMIT's answer is on its way back (it committed). Only this is
// answered 503 store_unavailable: the outcome is unknown to the node. The
// retry finds the record finished and replays it.
func TestAtomicCommitOutcomeUnknown(t *testing.T) {
	t.Parallel()
	pool, _ := atomicDB(t)
	// In exec mode pgx sends a batch at once: in the other modes it
	// prepares the statements first, and that round trip's reply would be
	// the one held back.
	viaProxy, px := poolVia(t, pool.Config().ConnString(), func(c *pgxpool.Config) {
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	})
	s, err := pgrecords.New(testCtx(t), viaProxy)
	if err != nil {
		t.Fatal(err)
	}
	const key = "unknown-outcome"
	e := atomicRoute(t, s, func(c echo.Context) error {
		if err := ledgerInsert(c.Request().Context(), pgrecords.Tx(c), key, "h"); err != nil {
			return err
		}
		if c.Request().Header.Get("X-Mode") != "retry" {
			// The replies from now on stay in the proxy: the COMMIT
			// runs, its answer does not come back.
			px.Set(proxy.SlowReplies, time.Hour)
			go func() {
				wait.Until(30*time.Second, func() bool {
					var finished bool
					// The only record (its key is derived from the request's).
					_ = pool.QueryRow(context.Background(), `SELECT bool_or(finished) FROM idemgate_records`).Scan(&finished)
					return finished
				})
				px.Set(proxy.Cut, 0)
			}()
		}
		return c.String(http.StatusCreated, "written")
	}, nil)
	first := atomicSendMode(e, key, "")
	if first.Code != http.StatusServiceUnavailable || !strings.Contains(first.Body.String(), `"code":"store_unavailable"`) {
		t.Errorf("first = %d %q, want 503 store_unavailable", first.Code, first.Body)
	}
	px.Heal()
	retry := atomicSendMode(e, key, "retry")
	if retry.Code != http.StatusCreated || retry.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry = %d replayed=%q %q, want the committed answer replayed", retry.Code, retry.Header().Get("Idempotent-Replayed"), retry.Body)
	}
	if got := ledgerRows(t, pool, key); got != 1 {
		t.Errorf("ledger rows = %d, want 1", got)
	}
}
