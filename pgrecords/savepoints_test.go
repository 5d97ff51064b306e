package pgrecords_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/pgrecords"
)

// txScenario is what a handler does with its transaction; note records
// the outcome of each step, by name.
type txScenario func(ctx context.Context, tx pgx.Tx, key string, note func(step string, err error))

// stepOutcome names an error by SQLSTATE, "txclosed" for pgx.ErrTxClosed,
// or "err" for another client-side one.
func stepOutcome(err error) string {
	if err == nil {
		return "ok"
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	if errors.Is(err, pgx.ErrTxClosed) {
		return "txclosed"
	}
	return "err"
}

// steps are the outcomes a txScenario noted.
type steps struct {
	mu       sync.Mutex
	outcomes []string // step=outcome
	errs     []string // step: the error, for the failure message
}

func (s *steps) note(step string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.outcomes = append(s.outcomes, step+"="+stepOutcome(err))
	s.errs = append(s.errs, fmt.Sprintf("%s: %v", step, err))
}

func (s *steps) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.outcomes, " ")
}

// runInPgxTx runs scen in a plain pgx transaction of pool and commits it:
// what the handler would see outside an Atomic route.
func runInPgxTx(t *testing.T, pool *pgxpool.Pool, key string, scen txScenario) (noted *steps, committed string, commit error) {
	t.Helper()
	ctx := testCtx(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	noted = &steps{}
	scen(ctx, tx, key, noted.note)
	commit = tx.Commit(ctx)
	return noted, ledgerNodes(t, pool, key), commit
}

// runOnAtomicRoute runs scen as the handler of an Atomic route of s that
// answers 201, and returns the status the client got.
func runOnAtomicRoute(t *testing.T, s idemgate.Store, pool *pgxpool.Pool, key string, scen txScenario) (noted *steps, committed string, status int) {
	t.Helper()
	noted = &steps{}
	e := atomicRoute(t, s, func(c echo.Context) error {
		scen(c.Request().Context(), pgrecords.Tx(c), key, noted.note)
		return c.String(http.StatusCreated, "ok")
	}, nil)
	rec := atomicSend(e, key)
	return noted, ledgerNodes(t, pool, key), rec.Code
}

// savepointScenarios are handlers' uses of savepoints, with the errors
// inside them that the handler survives (rolls back to the savepoint,
// or goes on).
var savepointScenarios = []struct {
	name string
	scen txScenario
}{
	{"parse error in a savepoint rolled back", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		note("before", ledgerInsert(ctx, tx, k, "before"))
		sp, err := tx.Begin(ctx)
		note("begin", err)
		_, err = sp.Exec(ctx, `INSERT INTO audit_log (key) VALUES ($1)`, k)
		note("missing-table", err)
		note("rollback", sp.Rollback(ctx))
		note("after", ledgerInsert(ctx, tx, k, "after"))
	}},
	{"parse error in a savepoint before any statement", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		sp, err := tx.Begin(ctx)
		note("begin", err)
		_, err = sp.Exec(ctx, `INSERT INTO audit_log (key) VALUES ($1)`, k)
		note("missing-table", err)
		note("rollback", sp.Rollback(ctx))
		note("after", ledgerInsert(ctx, tx, k, "after"))
	}},
	{"undefined column probe in a savepoint (feature detection)", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		note("before", ledgerInsert(ctx, tx, k, "before"))
		err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			_, err := sp.Exec(ctx, `UPDATE ledger SET amount = 1 WHERE key = $1`, k)
			return err
		})
		note("beginfunc", err)
		note("after", ledgerInsert(ctx, tx, k, "after"))
	}},
	{"encode error in a savepoint rolled back", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		note("before", ledgerInsert(ctx, tx, k, "before"))
		sp, err := tx.Begin(ctx)
		note("begin", err)
		_, err = sp.Exec(ctx, `SELECT $1::int4`, int64(1)<<40)
		note("overflow", err)
		note("rollback", sp.Rollback(ctx))
		note("after", ledgerInsert(ctx, tx, k, "after"))
	}},
	{"encode error after a released savepoint", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		note("before", ledgerInsert(ctx, tx, k, "before"))
		note("sp", pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error { return ledgerInsert(ctx, sp, k, "in-sp") }))
		_, err := tx.Exec(ctx, `SELECT $1::int4`, int64(1)<<40)
		note("overflow", err)
		note("after", ledgerInsert(ctx, tx, k, "after"))
	}},
	{"cancelled statement context in a savepoint", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		note("before", ledgerInsert(ctx, tx, k, "before"))
		sp, err := tx.Begin(ctx)
		note("begin", err)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err = sp.Exec(cctx, `INSERT INTO ledger (key, node) VALUES ($1, 'cancelled')`, k)
		note("cancelled", err)
		note("rollback", sp.Rollback(ctx))
		note("after", ledgerInsert(ctx, tx, k, "after"))
	}},
	{"nested 3 deep, middle rolled back", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		sp1, _ := tx.Begin(ctx)
		note("a", ledgerInsert(ctx, sp1, k, "a"))
		sp2, _ := sp1.Begin(ctx)
		note("b", ledgerInsert(ctx, sp2, k, "b"))
		sp3, _ := sp2.Begin(ctx)
		note("c", ledgerInsert(ctx, sp3, k, "c"))
		note("commit3", sp3.Commit(ctx))
		note("rollback2", sp2.Rollback(ctx))
		note("d", ledgerInsert(ctx, sp1, k, "d"))
		note("commit1", sp1.Commit(ctx))
		note("e", ledgerInsert(ctx, tx, k, "e"))
	}},
	{"nested 3 deep, innermost empty, middle rolled back, nothing after", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		note("z", ledgerInsert(ctx, tx, k, "z"))
		sp1, _ := tx.Begin(ctx)
		note("a", ledgerInsert(ctx, sp1, k, "a"))
		sp2, _ := sp1.Begin(ctx)
		note("b", ledgerInsert(ctx, sp2, k, "b"))
		sp3, _ := sp2.Begin(ctx)
		note("commit3", sp3.Commit(ctx))
		note("rollback2", sp2.Rollback(ctx))
		note("commit1", sp1.Commit(ctx))
	}},
	{"swallowed error in a nested savepoint", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		sp1, _ := tx.Begin(ctx)
		note("a", ledgerInsert(ctx, sp1, k, "a"))
		sp2, _ := sp1.Begin(ctx)
		_, err := sp2.Exec(ctx, `SELECT 1/0`)
		note("div0", err)
		note("rollback2", sp2.Rollback(ctx))
		note("b", ledgerInsert(ctx, sp1, k, "b"))
		note("commit1", sp1.Commit(ctx))
		note("c", ledgerInsert(ctx, tx, k, "c"))
	}},
	{"parent rolled back, then child committed, then a write", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		note("z", ledgerInsert(ctx, tx, k, "z"))
		sp1, _ := tx.Begin(ctx)
		note("a", ledgerInsert(ctx, sp1, k, "a"))
		sp2, _ := sp1.Begin(ctx)
		note("b", ledgerInsert(ctx, sp2, k, "b"))
		note("rollback1", sp1.Rollback(ctx))
		note("commit2", sp2.Commit(ctx))
		note("c", ledgerInsert(ctx, tx, k, "c"))
	}},
	{"parent rolled back, then child committed, nothing after", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		note("z", ledgerInsert(ctx, tx, k, "z"))
		sp1, _ := tx.Begin(ctx)
		note("a", ledgerInsert(ctx, sp1, k, "a"))
		sp2, _ := sp1.Begin(ctx)
		note("b", ledgerInsert(ctx, sp2, k, "b"))
		note("rollback1", sp1.Rollback(ctx))
		note("commit2", sp2.Commit(ctx))
	}},
	{"parent released, then child rolled back", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		note("z", ledgerInsert(ctx, tx, k, "z"))
		sp1, _ := tx.Begin(ctx)
		note("a", ledgerInsert(ctx, sp1, k, "a"))
		sp2, _ := sp1.Begin(ctx)
		note("b", ledgerInsert(ctx, sp2, k, "b"))
		note("commit1", sp1.Commit(ctx))
		note("rollback2", sp2.Rollback(ctx))
		note("c", ledgerInsert(ctx, tx, k, "c"))
	}},
	{"committed savepoint used again, then a new one", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		sp, _ := tx.Begin(ctx)
		note("a", ledgerInsert(ctx, sp, k, "a"))
		note("commit", sp.Commit(ctx))
		note("b-on-committed", ledgerInsert(ctx, sp, k, "b"))
		_, err := sp.Begin(ctx)
		note("begin-on-committed", err)
		sp2, _ := tx.Begin(ctx)
		note("c", ledgerInsert(ctx, sp2, k, "c"))
		note("commit2", sp2.Commit(ctx))
		note("d", ledgerInsert(ctx, tx, k, "d"))
	}},
	{"failed statement, then savepoint committed anyway", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		sp, _ := tx.Begin(ctx)
		note("a", ledgerInsert(ctx, sp, k, "a"))
		_, err := sp.Exec(ctx, `SELECT 1/0`)
		note("div0", err)
		note("commit", sp.Commit(ctx))
		note("b", ledgerInsert(ctx, tx, k, "b"))
	}},
	{"savepoint's first statement fails, rolled back", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		note("z", ledgerInsert(ctx, tx, k, "z"))
		sp, _ := tx.Begin(ctx)
		_, err := sp.Exec(ctx, `SELECT 1/0`)
		note("div0", err)
		note("rollback", sp.Rollback(ctx))
		note("b", ledgerInsert(ctx, tx, k, "b"))
	}},
	{"QueryRow scan error in a savepoint", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		sp, _ := tx.Begin(ctx)
		note("a", ledgerInsert(ctx, sp, k, "a"))
		var n int
		note("scan", sp.QueryRow(ctx, `SELECT 'x'`).Scan(&n))
		note("rollback", sp.Rollback(ctx))
		note("b", ledgerInsert(ctx, tx, k, "b"))
	}},
	{"QueryRow scan error as a savepoint's first statement", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		note("z", ledgerInsert(ctx, tx, k, "z"))
		sp, _ := tx.Begin(ctx)
		var n int
		note("scan", sp.QueryRow(ctx, `INSERT INTO ledger (key, node) VALUES ($1, 'q') RETURNING node`, k).Scan(&n))
		note("commit", sp.Commit(ctx))
		note("b", ledgerInsert(ctx, tx, k, "b"))
	}},
	{"rows left open across a savepoint commit", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		sp, _ := tx.Begin(ctx)
		rows, err := sp.Query(ctx, `SELECT generate_series(1, 3)`)
		note("query", err)
		note("commit-rows-open", sp.Commit(ctx))
		if rows != nil {
			rows.Close()
			note("rows", rows.Err())
		}
		note("b", ledgerInsert(ctx, tx, k, "b"))
	}},
	{"SendBatch with a failing middle statement in a savepoint", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		note("z", ledgerInsert(ctx, tx, k, "z"))
		sp, _ := tx.Begin(ctx)
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO ledger (key, node) VALUES ($1, 'batch-a')`, k)
		b.Queue(`SELECT 1/0`)
		b.Queue(`INSERT INTO ledger (key, node) VALUES ($1, 'batch-b')`, k)
		br := sp.SendBatch(ctx, b)
		_, e1 := br.Exec()
		_, e2 := br.Exec()
		_, e3 := br.Exec()
		note("batch1", e1)
		note("batch2", e2)
		note("batch3", e3)
		note("batchclose", br.Close())
		note("rollback", sp.Rollback(ctx))
		note("c", ledgerInsert(ctx, tx, k, "c"))
	}},
	{"CopyFrom in a savepoint rolled back", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		note("z", ledgerInsert(ctx, tx, k, "z"))
		sp, _ := tx.Begin(ctx)
		_, err := sp.CopyFrom(ctx, pgx.Identifier{"ledger"}, []string{"key", "node"}, pgx.CopyFromRows([][]any{{k, "copied"}}))
		note("copy", err)
		note("rollback", sp.Rollback(ctx))
		note("c", ledgerInsert(ctx, tx, k, "c"))
	}},
	{"Prepare in a savepoint rolled back", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		sp, _ := tx.Begin(ctx)
		_, err := sp.Prepare(ctx, "ledger_insert", `INSERT INTO ledger (key, node) VALUES ($1, $2)`)
		note("prepare", err)
		_, err = sp.Exec(ctx, "ledger_insert", k, "in-sp")
		note("exec-prepared", err)
		note("rollback", sp.Rollback(ctx))
		_, err = tx.Exec(ctx, "ledger_insert", k, "after")
		note("exec-prepared-after", err)
	}},
	{"Conn used in a savepoint, then rolled back", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		note("z", ledgerInsert(ctx, tx, k, "z"))
		sp, _ := tx.Begin(ctx)
		note("a", ledgerInsert(ctx, sp, k, "a"))
		_, err := sp.Conn().Exec(ctx, `INSERT INTO ledger (key, node) VALUES ($1, 'raw')`, k)
		note("raw", err)
		note("rollback", sp.Rollback(ctx))
		note("c", ledgerInsert(ctx, tx, k, "c"))
	}},
	{"Conn taken after a savepoint began, raw write, rollback", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		note("z", ledgerInsert(ctx, tx, k, "z"))
		sp, _ := tx.Begin(ctx)
		_, err := tx.Conn().Exec(ctx, `INSERT INTO ledger (key, node) VALUES ($1, 'raw')`, k)
		note("raw", err)
		note("rollback", sp.Rollback(ctx))
		note("c", ledgerInsert(ctx, tx, k, "c"))
	}},
	{"LargeObjects of a savepoint, rolled back", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		note("z", ledgerInsert(ctx, tx, k, "z"))
		sp, _ := tx.Begin(ctx)
		lo := sp.LargeObjects()
		oid, err := lo.Create(ctx, 0)
		note("lo-create", err)
		note("rollback", sp.Rollback(ctx))
		var n int
		note("lo-count", tx.QueryRow(ctx, `SELECT count(*) FROM pg_largeobject_metadata WHERE oid = $1`, oid).Scan(&n))
		if n != 0 {
			note("lo-kept", errors.New("the large object outlived its savepoint"))
		}
		note("c", ledgerInsert(ctx, tx, k, "c"))
	}},
	{"empty savepoint rolled back twice between writes", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		note("a", ledgerInsert(ctx, tx, k, "a"))
		sp, _ := tx.Begin(ctx)
		note("rollback", sp.Rollback(ctx))
		note("rollback-again", sp.Rollback(ctx))
		note("b", ledgerInsert(ctx, tx, k, "b"))
	}},
	{"released savepoint then a failing one rolled back", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		sp1, _ := tx.Begin(ctx)
		note("a", ledgerInsert(ctx, sp1, k, "a"))
		note("commit1", sp1.Commit(ctx))
		sp2, _ := tx.Begin(ctx)
		_, err := sp2.Exec(ctx, `SELECT 1/0`)
		note("div0", err)
		note("rollback2", sp2.Rollback(ctx))
		note("b", ledgerInsert(ctx, tx, k, "b"))
	}},
	{"outer savepoint rolled back with a spent context", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		sp1, _ := tx.Begin(ctx)
		_, err := sp1.Begin(ctx)
		note("begin2", err)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		note("rollback1-cancelled", sp1.Rollback(cctx))
		note("a", ledgerInsert(ctx, tx, k, "a"))
	}},
	// The handler's first statement fails to encode: pgx raises it before
	// anything of it reaches the server, and a plain pgx transaction stays
	// usable; on an Atomic route the batch carrying BEGIN failed with it.
	{"encode error as the first statement, then a write", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		_, err := tx.Exec(ctx, `SELECT $1::int4`, int64(1)<<40)
		note("overflow", err)
		note("a", ledgerInsert(ctx, tx, k, "a"))
	}},
	{"wrong argument count as the first statement, then a write", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		_, err := tx.Exec(ctx, `INSERT INTO ledger (key, node) VALUES ($1, $2)`, k)
		note("arguments", err)
		note("a", ledgerInsert(ctx, tx, k, "a"))
	}},
	{"encode error as the first statement, nothing after", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		_, err := tx.Exec(ctx, `SELECT $1::int4`, int64(1)<<40)
		note("overflow", err)
	}},
	{"encode error in the first QueryRow, then a savepoint", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		var n int
		note("overflow", tx.QueryRow(ctx, `SELECT $1::int4`, int64(1)<<40).Scan(&n))
		note("sp", pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error { return ledgerInsert(ctx, sp, k, "in-sp") }))
		note("a", ledgerInsert(ctx, tx, k, "a"))
	}},
	{"encode error in the first statement of the first batch, then a write", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		b := &pgx.Batch{}
		b.Queue(`SELECT $1::int4`, int64(1)<<40)
		b.Queue(`INSERT INTO ledger (key, node) VALUES ($1, 'batch')`, k)
		br := tx.SendBatch(ctx, b)
		_, e1 := br.Exec()
		_, e2 := br.Exec()
		note("batch1", e1)
		note("batch2", e2)
		note("batchclose", br.Close())
		note("a", ledgerInsert(ctx, tx, k, "a"))
	}},
	// pgx closes its connection when a statement of the batch was queued
	// in front of the one that fails to encode: the transaction is lost.
	{"encode error in the second statement of the first batch, then a write", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO ledger (key, node) VALUES ($1, 'batch')`, k)
		b.Queue(`SELECT $1::int4`, int64(1)<<40)
		br := tx.SendBatch(ctx, b)
		_, e1 := br.Exec()
		_, e2 := br.Exec()
		note("batch1", e1)
		note("batch2", e2)
		note("batchclose", br.Close())
		note("a", ledgerInsert(ctx, tx, k, "a"))
	}},
	{"handler's own SAVEPOINT statement named like pgx's", func(ctx context.Context, tx pgx.Tx, k string, note func(string, error)) {
		_, err := tx.Exec(ctx, `SAVEPOINT sp_1`)
		note("raw-savepoint", err)
		note("a", ledgerInsert(ctx, tx, k, "a"))
		sp, _ := tx.Begin(ctx)
		note("b", ledgerInsert(ctx, sp, k, "b"))
		note("commit", sp.Commit(ctx))
		_, err = tx.Exec(ctx, `ROLLBACK TO SAVEPOINT sp_1`)
		note("raw-rollback", err)
		note("c", ledgerInsert(ctx, tx, k, "c"))
	}},
}

// TestSavepointsMatchPgx runs each of savepointScenarios in a plain pgx
// transaction and as the handler of an Atomic route: each step's outcome
// (by SQLSTATE), the ledger rows that commit, and whether the answer is
// kept (the pgx transaction commits, the client gets the handler's 201)
// must be the same.
func TestSavepointsMatchPgx(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	for _, sc := range savepointScenarios {
		t.Run(sc.name, func(t *testing.T) {
			k := "savepoint-" + strings.ReplaceAll(sc.name, " ", "-")
			wantSteps, wantNodes, commit := runInPgxTx(t, pool, k+"-pgx", sc.scen)
			gotSteps, gotNodes, status := runOnAtomicRoute(t, s, pool, k, sc.scen)
			if gotSteps.String() != wantSteps.String() {
				t.Errorf("steps differ:\n pgx    %q\n Atomic %q", wantSteps.errs, gotSteps.errs)
			}
			if gotNodes != wantNodes {
				t.Errorf("committed: Atomic %q, pgx %q", gotNodes, wantNodes)
			}
			if (commit == nil) != (status == http.StatusCreated) {
				t.Errorf("Atomic route answered %d; pgx's commit: %v", status, commit)
			}
		})
	}
}
