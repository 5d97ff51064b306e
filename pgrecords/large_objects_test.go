package pgrecords_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/pgrecords"
)

// TestTxLargeObjectsClosedAfterRequest: every large objects handle the
// request's transaction gave out (its own, a savepoint's, an open large
// object, one asked for after the request) fails with pgx.ErrTxClosed
// once the request is over, and runs nothing on the connection, which
// serves other requests by then: a pool of one connection, whose next
// request's transaction must not see a large object created by the last.
func TestTxLargeObjectsClosedAfterRequest(t *testing.T) {
	t.Parallel()
	pool, _ := atomicDB(t)
	one := poolWith(t, pool.Config().ConnString(), func(c *pgxpool.Config) { c.MaxConns = 2 })
	s, err := pgrecords.New(testCtx(t), one)
	if err != nil {
		t.Fatal(err)
	}
	type kept struct {
		tx         pgx.Tx
		los, spLOs pgx.LargeObjects
		obj        *pgx.LargeObject
	}
	var k kept
	e := atomicRoute(t, s, func(c echo.Context) error {
		ctx := c.Request().Context()
		k.tx = pgrecords.Tx(c)
		k.los = k.tx.LargeObjects()
		oid, err := k.los.Create(ctx, 0)
		if err != nil {
			return err
		}
		if k.obj, err = k.los.Open(ctx, oid, pgx.LargeObjectModeWrite); err != nil {
			return err
		}
		sp, err := k.tx.Begin(ctx)
		if err != nil {
			return err
		}
		k.spLOs = sp.LargeObjects() // the savepoint left open: it commits with the transaction
		return c.String(http.StatusCreated, fmt.Sprint(oid))
	}, nil)
	if rec := atomicSend(e, "large-objects"); rec.Code != http.StatusCreated {
		t.Fatalf("request = %d %s", rec.Code, rec.Body)
	}
	var objects int
	if err := pool.QueryRow(testCtx(t), `SELECT count(*) FROM pg_largeobject_metadata`).Scan(&objects); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	for _, tt := range []struct {
		name string
		use  func() error
	}{
		{"the transaction's, Create", func() error { _, err := k.los.Create(ctx, 0); return err }},
		{"the transaction's, Unlink", func() error { return k.los.Unlink(ctx, 1) }},
		{"a savepoint's, Create", func() error { _, err := k.spLOs.Create(ctx, 0); return err }},
		{"an open large object, Write", func() error { _, err := k.obj.Write([]byte("late")); return err }},
		{"an open large object, Close", func() error { return k.obj.Close() }},
		{"asked for after the request, Create", func() error {
			los := k.tx.LargeObjects()
			_, err := los.Create(ctx, 0)
			return err
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := func() (err error) {
				defer func() {
					if p := recover(); p != nil {
						err = fmt.Errorf("panic: %v", p)
					}
				}()
				return tt.use()
			}()
			if !errors.Is(err, pgx.ErrTxClosed) {
				t.Errorf("after the request = %v, want pgx.ErrTxClosed", err)
			}
		})
	}
	var after int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_largeobject_metadata`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != objects {
		t.Errorf("large objects: %d after the late calls, %d before: a late call ran on the pool", after, objects)
	}
	var stray string
	if err := one.QueryRow(ctx, `SELECT current_setting('transaction_isolation') || ' ' || (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%')`).Scan(&stray); err != nil {
		t.Fatal(err)
	}
	if stray[len(stray)-1] != '0' {
		t.Errorf("sessions idle in a transaction after the late calls: %s", stray)
	}
}
