package pgstore

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/wait"
)

// A worker's heartbeat (its tasks in map order) and its completer (a
// batch in arrival order) update the same rows at once. Each locks them
// in the order of their IDs, so the two never deadlock: here the batch
// lists the tasks in one order and the heartbeat in the other, and two
// transactions holding one row each let them go one after the other so
// that, locking in the order given, each statement would hold one row
// and wait for the other's ("deadlock detected", seen with the
// statements that locked in the order of their arrays).
func TestHeartbeatAndCompleterLockInOneOrder(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	var ids []string
	for _, key := range []string{"a", "b"} {
		task := mustSubmit(t, s, newTask(key))
		ids = append(ids, task.ID)
	}
	slices.Sort(ids)
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'running', attempt = 1,
	lease_until = now() + interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	// A table of some size, as in production: the statements look their
	// rows up by ID, in the order they are given (a table of two rows is
	// read whole, in its physical order, by both).
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks (tenant, owner, kind, runtime, network,
	idempotency_key, fingerprint, state, finished_at)
SELECT 'bulk', 'o', 'image', 'gpu', 'main', 'bulk-' || g, 'v1:a', 'succeeded', now() FROM generate_series(1, 20000) g;
ANALYZE idemgate_tasks`); err != nil {
		t.Fatal(err)
	}
	conn := func() *pgxpool.Conn {
		c, err := s.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Release)
		return c
	}
	holders := make([]pgx.Tx, 2)
	for i, id := range ids {
		tx, err := conn().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, `SELECT FROM idemgate_tasks WHERE id = $1::uuid FOR UPDATE`, id); err != nil {
			t.Fatal(err)
		}
		holders[i] = tx
	}
	pidOf := func(tx pgx.Tx) int64 { return int64(tx.Conn().PgConn().PID()) }
	blockedBy := func(pid uint32) []int64 {
		var by []int64
		if err := s.pool.QueryRow(ctx, `SELECT coalesce(array_agg(p::bigint), '{}') FROM unnest(pg_blocking_pids($1)) p`,
			int(pid)).Scan(&by); err != nil {
			t.Fatal(err)
		}
		return by
	}
	finishC, beatC := conn(), conn()
	finishPID, beatPID := finishC.Conn().PgConn().PID(), beatC.Conn().PgConn().PID()
	errs := make(chan error, 2)
	go func() { // the completer: b, then a
		_, err := finishC.Exec(ctx, sqlFinishBatch, pgx.NamedArgs{"ids": []string{ids[1], ids[0]}, "attempts": []int{1, 1},
			"states": []string{"succeeded", "succeeded"}, "results": []string{"[1]", "[1]"}, "errors": []string{"", ""}})
		errs <- err
	}()
	wait.For(t, patience, "the batch waits", func() bool { return len(blockedBy(finishPID)) > 0 })
	go func() { // the heartbeat: a, then b
		_, err := beatC.Exec(ctx, sqlHeartbeat, pgx.NamedArgs{"ids": ids, "attempts": []int{1, 1}, "lease_us": int64(3e7)})
		errs <- err
	}()
	wait.For(t, patience, "the heartbeat waits", func() bool { return len(blockedBy(beatPID)) > 0 })
	// a goes: whoever waited for it takes it, and waits for b.
	if err := holders[0].Commit(ctx); err != nil {
		t.Fatal(err)
	}
	first := pidOf(holders[1])
	wait.For(t, patience, "both wait for b's holder or each other", func() bool {
		f, b := blockedBy(finishPID), blockedBy(beatPID)
		return len(f) > 0 && len(b) > 0 && !slices.Contains(f, pidOf(holders[0])) && !slices.Contains(b, pidOf(holders[0])) &&
			(slices.Contains(f, first) || slices.Contains(b, first))
	})
	if err := holders[1].Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("heartbeat or batch: %v", err)
		}
	}
	if n := countRows(t, s.pool, "state = 'succeeded' AND tenant = 'acme'"); n != 2 {
		t.Fatalf("%d of 2 tasks succeeded", n)
	}
}
