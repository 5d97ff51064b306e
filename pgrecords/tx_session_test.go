package pgrecords_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/internal/wait"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
)

// appRole creates a role of the database's own (roles are the cluster's;
// its name is the database's) that the handler switches to: no rights on
// the records table, the rights on ledger that row-level security
// filters. It is dropped with the test.
func appRole(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var role string
	if err := pool.QueryRow(testCtx(t), `SELECT current_database() || '_app'`).Scan(&role); err != nil {
		t.Fatal(err)
	}
	id := pgx.Identifier{role}.Sanitize()
	for _, q := range []string{
		`CREATE ROLE ` + id + ` NOLOGIN`,
		`GRANT SELECT, INSERT ON ledger TO ` + id,
		`ALTER TABLE ledger ENABLE ROW LEVEL SECURITY`,
		`CREATE POLICY ledger_tenant ON ledger USING (node = current_setting('app.tenant', true)) WITH CHECK (node = current_setting('app.tenant', true))`,
	} {
		if _, err := pool.Exec(testCtx(t), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP OWNED BY `+id+`; DROP ROLE `+id); err != nil {
			t.Errorf("drop role: %v", err)
		}
	})
	return role
}

// lockRecordWhileCommitting holds the records locked (FOR UPDATE,
// from another connection) from the moment the handler answers until the
// completion is seen waiting for it, or the request is over: the
// completion then waits on a lock, as it does when a reclaim of the key
// holds the row for a moment.
func lockRecordWhileCommitting(t *testing.T, pool *pgxpool.Pool, over <-chan struct{}) {
	t.Helper()
	ctx := testCtx(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The records' keys are derived from the request's: lock them all (the
	// subtests run one after another).
	if _, err := tx.Exec(ctx, `SELECT 1 FROM idemgate_records FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer tx.Rollback(context.Background())
		wait.Until(30*time.Second, func() bool {
			select {
			case <-over:
				return true
			default:
			}
			var waiting int
			_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
			return waiting > 0
		})
		// Seen waiting: a moment more, so that a timeout the handler
		// set (1ms) would have fired.
		time.Sleep(50 * time.Millisecond)
	}()
}

// TestTxHandlerSessionState: what a handler sets in its transaction (a
// search_path per tenant, SET LOCAL ROLE for row-level security, a tiny
// statement_timeout or lock_timeout, SERIALIZABLE) does not stop the
// completion: the answer is stored with the writes, and the retry
// replays it. What cannot be undone within the transaction (READ ONLY:
// the record cannot be written; a role without USAGE on the records'
// schema) is the handler's fault, answered as one that broke its
// transaction: 500, released tx_aborted, no store_error; never a 503 that
// sends the client into a retry loop.
func TestTxHandlerSessionState(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	admin := newPool(t, dsn)
	for _, q := range []string{
		ledgerDDL,
		`CREATE SCHEMA tenant_a`,
		`CREATE TABLE tenant_a.ledger (key text NOT NULL, node text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`,
		`CREATE SCHEMA recs`,
	} {
		if _, err := admin.Exec(testCtx(t), q); err != nil {
			t.Fatal(err)
		}
	}
	role := appRole(t, admin)
	public := newStore(t, admin)
	// The role the handler sets calls the completion: EXECUTE is granted
	// to no one but the owner (schema v4).
	if _, err := admin.Exec(testCtx(t), `GRANT EXECUTE ON FUNCTION idemgate_records_commit_tx(text, uuid, bigint, bytea) TO `+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	inRecs := newStore(t, poolWith(t, dsn, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["search_path"] = "recs, public" }))
	setRole := `SET LOCAL ROLE ` + pgx.Identifier{role}.Sanitize()

	for _, tt := range []struct {
		name   string
		store  *pgrecords.Store
		given  []string // the handler's statements before its write
		locked bool     // the record's row is locked while the completion runs
		table  string   // where the handler's write lands
		node   string
		want   int // the first answer; 201: stored and replayed
	}{
		{name: "search_path per tenant", store: public, given: []string{`SET LOCAL search_path = tenant_a`}, table: "tenant_a.ledger", want: 201},
		{name: "role with row-level security", store: public, given: []string{setRole, `SET LOCAL app.tenant = 'rls'`}, node: "rls", want: 201},
		{name: "tiny statement_timeout", store: public, given: []string{`SET LOCAL statement_timeout = 1`}, locked: true, want: 201},
		{name: "tiny lock_timeout", store: public, given: []string{`SET LOCAL lock_timeout = 1`}, locked: true, want: 201},
		{name: "serializable", store: public, given: []string{`SET TRANSACTION ISOLATION LEVEL SERIALIZABLE`}, want: 201},
		{name: "read only", store: public, given: []string{`SET TRANSACTION READ ONLY`}, want: 500},
		{name: "role without usage on the records' schema", store: inRecs, given: []string{setRole, `SET LOCAL app.tenant = 'norecs'`}, node: "norecs", want: 500},
	} {
		t.Run(tt.name, func(t *testing.T) {
			key := strings.ReplaceAll(tt.name, " ", "-")
			node := tt.node
			if node == "" {
				node = "h"
			}
			table := tt.table
			if table == "" {
				table = "public.ledger"
			}
			var mu sync.Mutex
			var events []idemgate.Event
			over := make(chan struct{})
			e := atomicRoute(t, tt.store, func(c echo.Context) error {
				tx := pgrecords.Tx(c)
				ctx := c.Request().Context()
				for _, q := range tt.given {
					if _, err := tx.Exec(ctx, q); err != nil {
						return fmt.Errorf("%s: %w", q, err)
					}
				}
				if !strings.Contains(strings.Join(tt.given, ";"), "READ ONLY") {
					if _, err := tx.Exec(ctx, `INSERT INTO ledger (key, node) VALUES ($1, $2)`, key, node); err != nil {
						return err
					}
				}
				if tt.locked && c.Request().Header.Get("X-Mode") != "retry" {
					lockRecordWhileCommitting(t, admin, over)
				}
				return c.String(http.StatusCreated, "written")
			}, func(c *middleware.Config) {
				c.OnEvent = func(_ context.Context, ev idemgate.Event) { mu.Lock(); events = append(events, ev); mu.Unlock() }
			})
			first := atomicSendMode(e, key, "")
			close(over)
			if first.Code != tt.want {
				t.Fatalf("first = %d %q, want %d", first.Code, first.Body, tt.want)
			}
			mu.Lock()
			for _, ev := range events {
				if ev.Type == idemgate.EventStoreError {
					t.Errorf("store_error event %s: %v", ev.Reason, ev.Err)
				}
				if tt.want == 500 && ev.Type == idemgate.EventReleased && ev.Reason != "tx_aborted" {
					t.Errorf("released %s, want tx_aborted", ev.Reason)
				}
			}
			mu.Unlock()
			retry := atomicSendMode(e, key, "retry")
			var rows int
			if err := admin.QueryRow(testCtx(t), `SELECT count(*) FROM `+table+` WHERE key = $1`, key).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			if tt.want == 201 {
				if retry.Code != 201 || retry.Header().Get("Idempotent-Replayed") != "true" {
					t.Errorf("retry = %d replayed=%q, want the stored answer", retry.Code, retry.Header().Get("Idempotent-Replayed"))
				}
				if rows != 1 {
					t.Errorf("%d rows in %s, want 1 (committed with the answer)", rows, table)
				}
				return
			}
			if retry.Code != tt.want || retry.Header().Get("Idempotent-Replayed") != "" {
				t.Errorf("retry = %d replayed=%q, want %d again (the handler ran again)", retry.Code, retry.Header().Get("Idempotent-Replayed"), tt.want)
			}
			if rows != 0 {
				t.Errorf("%d rows in %s, want 0 (rolled back)", rows, table)
			}
		})
	}
}
