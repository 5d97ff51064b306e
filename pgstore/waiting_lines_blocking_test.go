package pgstore

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Handlers take their transactions from the pool the store uses (the
// common setup: one pool a process) and call SubmitTx. With every
// connection of the pool held by such a transaction, SubmitTx must not
// need another one of the same pool: it would wait for a connection no
// one gives back.
func TestSubmitTxWithEveryPoolConnectionInAHandlersTransaction(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	cfg, err := pgxpool.ParseConfig(db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := newStore(pool)
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx := hangBound(t) // nothing here needs to wait
	var began sync.WaitGroup
	began.Add(2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tx, err := pool.Begin(ctx)
			began.Done()
			if err != nil {
				errs[i] = err
				return
			}
			defer func() { _ = tx.Rollback(ctx) }()
			began.Wait() // both connections taken
			if _, err := s.SubmitTx(ctx, tx, tenantTask(fmt.Sprintf("t%d", i), "k")); err != nil {
				errs[i] = err
				return
			}
			errs[i] = tx.Commit(ctx)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("handler %d: %v", i, err)
		}
	}
}

// SubmitTx's listing of an already listed line (stamped in the last 30 s)
// should write nothing: no transaction ID, no WAL, no commit to flush.
func TestSubmitTxOfAListedLineWritesNothingOutsideTheTransaction(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	mustSubmit(t, s, tenantTask("hot", "k-0"))
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, sqlListLine, pgx.NamedArgs{"kind": "image", "priority": 0, "tenant": "hot"}); err != nil {
		t.Fatal(err)
	}
	var xid *int64
	if err := tx.QueryRow(ctx, `SELECT txid_current_if_assigned()`).Scan(&xid); err != nil {
		t.Fatal(err)
	}
	if xid != nil {
		t.Fatalf("listing a line listed a moment ago took transaction ID %d: a write and a commit to flush, every SubmitTx", *xid)
	}
}

// A database whose default isolation is not READ COMMITTED (ALTER
// DATABASE … SET default_transaction_isolation, a common hardening):
// a worker's sweep must still remove empty lines, or the table keeps
// every line that ever had work and the walk past capped tenants reads
// them all.
func TestSweepUnderADatabaseDefaultIsolation(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx := context.Background()
	setupPool := db.pool(t)
	if _, err := setupPool.Exec(ctx, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = %L',
		current_database(), 'repeatable read'); END $$`); err != nil {
		t.Fatal(err)
	}
	s := db.store(t) // a new pool: its sessions take the new default
	for i := range 10 {
		mustSubmit(t, s, tenantTask(fmt.Sprintf("gone-%d", i), "k"))
	}
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'succeeded', finished_at = now()`); err != nil {
		t.Fatal(err)
	}
	sweepAll(t, s)
	if got := waitingLines(t, s); len(got) != 0 {
		t.Fatalf("after a sweep of empty lines under repeatable read by default: %v listed; want none", got)
	}
}

// A handler's transaction that has itself listed a line (its own SQL
// wrote a waiting task of a new line: the trigger listed it, the row is
// uncommitted) then calls SubmitTx for the same line. SubmitTx's listing
// on another connection of the pool waits for that row, that is for the
// caller's own transaction, which waits for SubmitTx: a wait across two
// connections that the server cannot see as a deadlock.
func TestSubmitTxAfterTheTransactionListedItsLine(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := hangBound(t) // nothing here needs to wait
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO idemgate_tasks
			(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, state, priority, turn, run_after)
			VALUES ('self', 'o', 'image', 'r', 'n', 'by-hand', 'f', 'pending', 0, 0, now())`); err != nil {
			return err
		}
		_, err := s.SubmitTx(ctx, tx, tenantTask("self", "by-submit"))
		return err
	})
	if err != nil {
		t.Fatalf("SubmitTx after the transaction listed the line itself: %v", err)
	}
}
