package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// writeWithoutTriggers inserts a due task of kind image, tenant and
// priority, with turn 0, as a data-only restore or a promoted logical
// replica writes it: with session_replication_role = replica, so that no
// trigger lists its line in idemgate_waiting_tenants.
func writeWithoutTriggers(t testing.TB, s *Store, tenant string, priority int, key string) string {
	t.Helper()
	ctx := context.Background()
	var id string
	if err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `INSERT INTO idemgate_tasks
			(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after, priority, turn)
			VALUES ($1, 'o', 'image', 'gpu', 'main', $2, 'f', now() - interval '1 minute', $3, 0)
			RETURNING id::text`, tenant, key, priority).Scan(&id)
	}); err != nil {
		t.Fatal(err)
	}
	return id
}

// A task whose line is not listed (written with triggers off) is claimed
// by a worker that names its kind while capped tenants of a higher
// priority have a backlog: that claim finds other tenants only by
// walking the listed lines, and the worker's maintenance lists the lines
// the triggers missed. Before, the task waited for as long as the other
// tenants stayed capped; a worker of every kind took it at once.
func TestTaskWrittenWithoutTriggersIsClaimedPastCappedTenants(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	capTenants(t, s, 6)
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET priority = 1 WHERE tenant LIKE 'capped-%'`); err != nil {
		t.Fatal(err)
	}
	id := writeWithoutTriggers(t, s, "restored", 0, "r-1")
	if n := orphanLines(t, s); n != 1 {
		t.Fatalf("%d lines unlisted after a write without triggers; want 1 (the test's premise)", n)
	}
	started := make(chan string, 16)
	w := newWorker(t, s, WorkerConfig{Kinds: []string{"image"}, Concurrency: 2, RescueInterval: 50 * time.Millisecond,
		Handler: func(ctx context.Context, task Task) Outcome {
			started <- task.Tenant
			<-ctx.Done()
			return Retry(0, ctx.Err())
		}})
	runWorker(t, w)
	entered := make(chan struct{})
	go func() {
		for tenant := range started {
			if tenant == "restored" {
				close(entered)
				return
			}
			t.Errorf("the worker started a task of capped tenant %s (MaxRunningPerTenant 1)", tenant)
		}
	}()
	waitEntered(t, s, entered)
	if got := state(t, s, id); got != StateRunning {
		t.Fatalf("the restored task is %s; want running", got)
	}
}

// One listing pass reads at most listBatch lines of the tasks' index,
// skipping from line to line: its cost does not grow with the lines'
// backlogs (due or scheduled), only with the lines it reads, and a full
// cycle lists every line the triggers missed.
func TestListingUnlistedLinesReadsNoBacklog(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	const lines = 300
	// Another kind's 180k tasks, in one line that sorts after the image
	// lines the pass reads: the indexes have their depth at 360k tasks
	// from the start, so that the figures compare backlogs alone.
	execWithoutTriggers(t, s, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after, turn)
		SELECT 'big', 'o', 'video', 'gpu', 'main', 'v-' || g, 'f', now(), g
		FROM generate_series(1, 600 * $1) g`, lines)
	execWithoutTriggers(t, s, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after, turn)
		SELECT 'tenant-' || lpad(g::text, 4, '0'), 'o', 'image', 'gpu', 'main', 'one-' || g, 'f', now(), 0
		FROM generate_series(1, $1) g`, lines)
	if _, err := s.pool.Exec(ctx, "VACUUM ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
	small := listingBuffers(t, s)
	// Each line gets a backlog of 300 due tasks and 300 scheduled ones
	// (turn -1, which sort first in a line on the tenant_turn index).
	execWithoutTriggers(t, s, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after, turn)
		SELECT 'tenant-' || lpad((g % $1 + 1)::text, 4, '0'), 'o', 'image', 'gpu', 'main', 'bk-' || g, 'f',
			CASE WHEN g % 2 = 0 THEN now() ELSE now() + interval '1 day' END,
			CASE WHEN g % 2 = 0 THEN g ELSE -1 END
		FROM generate_series(1, 600 * $1) g`, lines)
	if _, err := s.pool.Exec(ctx, "VACUUM ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
	big := listingBuffers(t, s)
	t.Logf("one listing pass of %d unlisted lines: %d buffers with a task a line, %d with 600 a line", listBatch, small, big)
	if big > small+small/4 {
		t.Errorf("a listing pass read %d buffers beside a backlog of 600 tasks a line, %d beside one", big, small)
	}
	if small > listBatch*maxListingBuffersALine {
		t.Errorf("a listing pass of %d lines read %d buffers; want at most %d a line", listBatch, small, maxListingBuffersALine)
	}
	if n := orphanLines(t, s); n != lines+1 {
		t.Fatalf("%d lines unlisted before the listing; want %d", n, lines+1)
	}
	r := &rescuer{pool: s.pool}
	passes := 0
	for first := true; first || r.listAfter != (waitingLine{}); first = false {
		if _, err := r.listUnlisted(ctx); err != nil {
			t.Fatal(err)
		}
		passes++
	}
	if n := orphanLines(t, s); n != 0 {
		t.Fatalf("%d lines unlisted after a full cycle of listing passes", n)
	}
	if want := (lines+1)/listBatch + 1; passes != want {
		t.Fatalf("a full cycle over %d lines took %d passes; want %d", lines+1, passes, want)
	}
}

// execWithoutTriggers runs sql with session_replication_role = replica,
// as a data-only restore writes: no trigger lists the lines it writes.
func execWithoutTriggers(t testing.TB, s *Store, sql string, args ...any) {
	t.Helper()
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sql, args...)
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// maxListingBuffersALine bounds what a listing pass reads for each line:
// a descent of the tenant_turn index to the next line, a probe of
// idemgate_waiting_tenants and, for a line not listed, up to two
// descents to find a placed task.
const maxListingBuffersALine = 12

// listingBuffers runs the listing pass's read from the first line under
// EXPLAIN (ANALYZE, BUFFERS) and returns the buffers it touched.
func listingBuffers(t testing.TB, s *Store) int {
	t.Helper()
	var plan []map[string]any
	if err := s.pool.QueryRow(context.Background(), "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sqlUnlistedLines,
		pgx.NamedArgs{"kind": "", "priority": 0, "tenant": "", "limit": listBatch}).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	top := plan[0]["Plan"].(map[string]any)
	if rows := int(top["Actual Rows"].(float64)); rows != listBatch {
		t.Fatalf("the listing pass read %d lines; want %d", rows, listBatch)
	}
	return int(top["Shared Hit Blocks"].(float64) + top["Shared Read Blocks"].(float64))
}
