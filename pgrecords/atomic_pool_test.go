package pgrecords_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
)

// TestAtomicRenewalsFindAConnection: as many Atomic requests at once as the
// pool has connections, each with a statement slower than its lease,
// distinct keys, no other node. Transactions hold at most MaxConns-1
// connections (the others wait for a slot), so every renewal finds one:
// every request commits. (With a connection per transaction, no renewal
// got one, and every request answered 503 lease_lost.)
func TestAtomicRenewalsFindAConnection(t *testing.T) {
	t.Parallel()
	pool, _ := atomicDB(t)
	const conns = 2
	small := poolWith(t, pool.Config().ConnString(), func(c *pgxpool.Config) { c.MaxConns = conns })
	s, err := pgrecords.New(testCtx(t), small)
	if err != nil {
		t.Fatal(err)
	}
	const lease = time.Second
	e := atomicRoute(t, s, func(c echo.Context) error {
		tx := pgrecords.Tx(c)
		if _, err := tx.Exec(c.Request().Context(), `INSERT INTO ledger (key, node) VALUES ($1, 'h')`, c.Request().Header.Get("Idempotency-Key")); err != nil {
			return err
		}
		if _, err := tx.Exec(c.Request().Context(), `SELECT pg_sleep($1)`, (2 * lease).Seconds()); err != nil { // a slow statement
			return err
		}
		return c.String(http.StatusCreated, "ok")
	}, func(c *middleware.Config) { c.Lease = lease })
	answers := make([]*httptest.ResponseRecorder, conns)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() { answers[i] = atomicSend(e, fmt.Sprintf("starve-%d", i)) })
	}
	wg.Wait()
	for i, a := range answers {
		if a.Code != http.StatusCreated {
			t.Errorf("request %d of %d at once on a pool of %d (distinct keys, no contention) = %d %s",
				i, conns, conns, a.Code, strings.TrimSpace(a.Body.String()))
		}
	}
}

// TestAtomicExecModes: Atomic routes on pools in every exec mode
// (simple protocol for PgBouncer users, exec, describe): the lazy BEGIN
// batch with each first-statement kind, a rollback, and a lost lease.
func TestAtomicExecModes(t *testing.T) {
	t.Parallel()
	pool, _ := atomicDB(t)
	for _, mode := range allExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			_, s := storeInMode(t, pool.Config().ConnString(), mode)
			prefix := "mode-" + strings.ReplaceAll(mode.String(), " ", "_") + "-"
			e := atomicRoute(t, s, func(c echo.Context) error {
				tx := pgrecords.Tx(c)
				ctx := c.Request().Context()
				key := c.Request().Header.Get("Idempotency-Key")
				switch {
				case strings.HasSuffix(key, "query"):
					var n int
					if err := tx.QueryRow(ctx, `INSERT INTO ledger (key, node) VALUES ($1, 'q') RETURNING 1`, key).Scan(&n); err != nil {
						return err
					}
				case strings.HasSuffix(key, "batch"):
					b := &pgx.Batch{}
					b.Queue(`INSERT INTO ledger (key, node) VALUES ($1, 'b')`, key)
					if err := tx.SendBatch(ctx, b).Close(); err != nil {
						return err
					}
				default:
					if _, err := tx.Exec(ctx, `INSERT INTO ledger (key, node) VALUES ($1, 'e')`, key); err != nil {
						return err
					}
				}
				if strings.Contains(key, "fail") {
					return c.String(http.StatusServiceUnavailable, "no")
				}
				return c.String(http.StatusCreated, "ok")
			}, nil)
			for _, kind := range []string{"exec", "query", "batch"} {
				k := prefix + kind
				if rec := atomicSend(e, k); rec.Code != http.StatusCreated {
					t.Errorf("%s: %d %s", k, rec.Code, rec.Body)
				}
				if rec := atomicSend(e, k); rec.Header().Get("Idempotent-Replayed") != "true" {
					t.Errorf("%s replay: %d %s", k, rec.Code, rec.Body)
				}
				if got := ledgerRows(t, pool, k); got != 1 {
					t.Errorf("%s: %d ledger rows, want 1", k, got)
				}
				kf := prefix + "fail-" + kind
				if rec := atomicSend(e, kf); rec.Code != http.StatusServiceUnavailable {
					t.Errorf("%s: %d %s", kf, rec.Code, rec.Body)
				}
				if got := ledgerRows(t, pool, kf); got != 0 {
					t.Errorf("%s: %d ledger rows, want 0", kf, got)
				}
			}
		})
	}
}

// TestAtomicTwoStoresOnOnePool: two Stores on one pool (two pgrecords.New
// on the application's pool, say one per route group) bound their
// transactions together, to the pool's MaxConns less one: as many Atomic
// requests at once as the pool has connections, half on each store, each
// with a statement slower than its lease, all commit (every renewal finds
// a connection). Each store counting its own MaxConns-1 let them take
// every connection, and every request answered 503 lease_lost.
func TestAtomicTwoStoresOnOnePool(t *testing.T) {
	t.Parallel()
	pool, _ := atomicDB(t)
	const conns = 2
	small := poolWith(t, pool.Config().ConnString(), func(c *pgxpool.Config) { c.MaxConns = conns })
	var routes []*echo.Echo
	const lease = time.Second
	for range 2 {
		s, err := pgrecords.New(testCtx(t), small)
		if err != nil {
			t.Fatal(err)
		}
		routes = append(routes, atomicRoute(t, s, func(c echo.Context) error {
			tx := pgrecords.Tx(c)
			if _, err := tx.Exec(c.Request().Context(), `INSERT INTO ledger (key, node) VALUES ($1, 'h')`, c.Request().Header.Get("Idempotency-Key")); err != nil {
				return err
			}
			if _, err := tx.Exec(c.Request().Context(), `SELECT pg_sleep($1)`, (2 * lease).Seconds()); err != nil {
				return err
			}
			return c.String(http.StatusCreated, "ok")
		}, func(c *middleware.Config) { c.Lease = lease }))
	}
	answers := make([]*httptest.ResponseRecorder, conns)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() { answers[i] = atomicSend(routes[i%2], fmt.Sprintf("two-stores-%d", i)) })
	}
	wg.Wait()
	for i, a := range answers {
		if a.Code != http.StatusCreated {
			t.Errorf("request %d (store %d) = %d %s", i, i%2, a.Code, strings.TrimSpace(a.Body.String()))
		}
	}
}
