package pgrecords_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/internal/proxy"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
)

// TestAtomicPartitionedTxLocksEnd: node A writes a row with a unique key
// in its Atomic transaction (as pgstore.SubmitTx does: the task's unique
// index), then loses its link to Postgres. Its lease runs out and node B
// reclaims the key; B's handler writes the same unique key and waits on
// A's uncommitted row until the server ends A's session, idle in its
// transaction for longer than idle_in_transaction_session_timeout (twice
// A's lease, set with BEGIN). Without it, B would wait for as long as
// the partition lasts.
func TestAtomicPartitionedTxLocksEnd(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	if _, err := pool.Exec(testCtx(t), `CREATE TABLE uniq_task (key text PRIMARY KEY, node text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	poolA, px := poolVia(t, pool.Config().ConnString())
	storeA, err := pgrecords.New(testCtx(t), poolA)
	if err != nil {
		t.Fatal(err)
	}
	const lease = time.Second
	wrote, gate := make(chan struct{}, 1), make(chan struct{})
	handler := func(node string) echo.HandlerFunc {
		return func(c echo.Context) error {
			if _, err := pgrecords.Tx(c).Exec(c.Request().Context(), `INSERT INTO uniq_task (key, node) VALUES ('k', $1)`, node); err != nil {
				return err
			}
			if node == "a" {
				wrote <- struct{}{}
				<-gate
			}
			return c.String(http.StatusCreated, node)
		}
	}
	a := atomicRoute(t, storeA, handler("a"), func(c *middleware.Config) { c.Lease = lease })
	// B keeps the default lease (30 s): A's lease, and the idle limit it
	// sets, are what the test is about. B's handler waits on A's row for
	// about one of A's leases, held by its renewals alone; with A's 1 s
	// lease B's first renewal (on a connection its pool had to open,
	// given 333 ms) failed beside pgstore's tests, the next one came as
	// the lease ended, and B's commit found its claim gone: 503 lease_lost.
	b := atomicRoute(t, s, handler("b"), nil)

	aDone := make(chan *httptest.ResponseRecorder, 1)
	go func() { aDone <- atomicSend(a, "partition-lock") }()
	<-wrote
	px.Set(proxy.Freeze, 0)
	close(gate)

	bDone := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		for {
			rec := atomicSend(b, "partition-lock")
			if rec.Code != http.StatusConflict {
				bDone <- rec
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	// The idle limit is 2 leases; without it B would wait for as long as
	// the partition lasts, which is until the test heals it. A minute of
	// patience tells the two apart on any machine.
	const patience = time.Minute
	select {
	case rec := <-bDone:
		if rec.Code != http.StatusCreated {
			t.Errorf("B = %d %s, want 201", rec.Code, rec.Body)
		}
	case <-time.After(patience):
		var sessions string
		if err := pool.QueryRow(testCtx(t), `SELECT coalesce(string_agg(format('%s (waiting: %s)', state, coalesce(wait_event_type, 'no')), ', '), 'none')
			FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&sessions); err != nil {
			sessions = err.Error()
		}
		t.Errorf("node B, which took the key over after A's %v lease ran out, had not answered %v later; the database's other sessions: %s",
			lease, patience, sessions)
		px.Heal()
		<-bDone
	}
	px.Heal()
	if recA := <-aDone; recA.Code/100 == 2 {
		t.Errorf("A, partitioned before its commit, answered %d", recA.Code)
	}
	var node string
	if err := pool.QueryRow(testCtx(t), `SELECT node FROM uniq_task WHERE key = 'k'`).Scan(&node); err != nil || node != "b" {
		t.Errorf("uniq_task k = %q, %v; want b's row alone", node, err)
	}
}
