package pgrecords_test

import (
	"context"
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

// renewedLease is the lease of the tests whose claims outlive it on
// renewals alone: each renewal (every third of it) gets a third of it to
// find a connection (one the pool may have to open) and answer, and a
// claim one lease. At 1 s, renewals and claims beside pgstore's tests took
// longer, and requests answered 503 lease_lost and store_unavailable with
// every connection to be had.
const renewedLease = 3 * time.Second

// slowStatement is the handler's statement that outlasts renewedLease by
// half of it: without renewals the claim runs out before the commit.
const slowStatement = renewedLease + renewedLease/2

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
	e := atomicRoute(t, s, func(c echo.Context) error {
		tx := pgrecords.Tx(c)
		if _, err := tx.Exec(c.Request().Context(), `INSERT INTO ledger (key, node) VALUES ($1, 'h')`, c.Request().Header.Get("Idempotency-Key")); err != nil {
			return err
		}
		if _, err := tx.Exec(c.Request().Context(), `SELECT pg_sleep($1)`, slowStatement.Seconds()); err != nil {
			return err
		}
		return c.String(http.StatusCreated, "ok")
	}, func(c *middleware.Config) { c.Lease = renewedLease })
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
			if _, err := tx.Exec(c.Request().Context(), `SELECT pg_sleep($1)`, slowStatement.Seconds()); err != nil {
				return err
			}
			return c.String(http.StatusCreated, "ok")
		}, func(c *middleware.Config) { c.Lease = renewedLease }))
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

// TestAtomicPoolCursorHoldAndWait: a handler that keeps a cursor of the
// pool open (rows := pool.Query(…)) and writes through its transaction
// row by row holds two connections at once: the cursor's, and the one
// its transaction's first statement waits for. As many such requests at
// once as the pool has connections hold every connection with their
// cursors and wait for one another until their contexts end (here 2s):
// no request commits, each gets an error, and nothing is written. The
// store cannot see the cursor: docs/atomic-routes.md says to read
// through the transaction (or collect the rows first), which the second
// half does, on the same pool and concurrency: every request commits.
func TestAtomicPoolCursorHoldAndWait(t *testing.T) {
	t.Parallel()
	pool, _ := atomicDB(t)
	if _, err := pool.Exec(testCtx(t), `CREATE TABLE items (n int); INSERT INTO items SELECT generate_series(1, 3)`); err != nil {
		t.Fatal(err)
	}
	const conns = 2
	small := poolWith(t, pool.Config().ConnString(), func(c *pgxpool.Config) { c.MaxConns = conns })
	s, err := pgrecords.New(testCtx(t), small)
	if err != nil {
		t.Fatal(err)
	}
	throughTx := false
	var cursors sync.WaitGroup
	e := atomicRoute(t, s, func(c echo.Context) error {
		ctx, tx := c.Request().Context(), pgrecords.Tx(c)
		key := c.Request().Header.Get("Idempotency-Key")
		var items []int32
		if throughTx {
			rows, _ := tx.Query(ctx, `SELECT n FROM items`)
			var err error
			if items, err = pgx.CollectRows(rows, pgx.RowTo[int32]); err != nil {
				return err
			}
		} else {
			rows, err := small.Query(ctx, `SELECT n FROM items`)
			if err != nil {
				return err
			}
			defer rows.Close()
			cursors.Done()
			cursors.Wait() // every request holds its cursor's connection
			for rows.Next() {
				var n int32
				if err := rows.Scan(&n); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, `INSERT INTO ledger (key, node) VALUES ($1, $2)`, key, fmt.Sprint(n)); err != nil {
					return err
				}
			}
			return c.String(http.StatusCreated, "ok")
		}
		for _, n := range items {
			if _, err := tx.Exec(ctx, `INSERT INTO ledger (key, node) VALUES ($1, $2)`, key, fmt.Sprint(n)); err != nil {
				return err
			}
		}
		return c.String(http.StatusCreated, "ok")
	}, nil)
	// The requests of a half share one deadline: with one each, the
	// first to end freed its cursor's connection while another still had
	// a moment left to take it and commit (a loaded clean-clone run saw
	// request 1 answer 201).
	send := func(ctx context.Context, key string) *httptest.ResponseRecorder {
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		e.ServeHTTP(w, r)
		return w
	}
	for _, through := range []bool{false, true} {
		throughTx = through
		if !through {
			cursors.Add(conns)
		}
		answers := make([]*httptest.ResponseRecorder, conns)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var wg sync.WaitGroup
		for i := range conns {
			wg.Go(func() { answers[i] = send(ctx, fmt.Sprintf("cursor-%v-%d", through, i)) })
		}
		wg.Wait()
		cancel()
		for i, a := range answers {
			rows := ledgerRows(t, pool, fmt.Sprintf("cursor-%v-%d", through, i))
			switch {
			case through && (a.Code != http.StatusCreated || rows != 3):
				t.Errorf("reading through the transaction: request %d = %d %s, %d rows; want 201 and 3", i, a.Code, a.Body, rows)
			case !through && (a.Code/100 == 2 || rows != 0):
				t.Errorf("a pool cursor held while writing: request %d = %d, %d rows; want the hold-and-wait to fail every request", i, a.Code, rows)
			}
		}
	}
}
