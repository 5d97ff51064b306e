package pgstore

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
)

// with a backlog of another kind ahead, a claim for one kind
// reads about as much as without it.
func TestClaimIgnoresOtherKindsBacklog(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	mustSubmit(t, s, newTask("the-image"))
	before := claimBuffers(t, s, []string{"image"})
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after)
		SELECT 'acme', 'o', 'video', 'gpu', 'main', 'video-' || g, 'f', now() - interval '1 hour'
		FROM generate_series(1, 50000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, "ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
	for _, kinds := range [][]string{{"image"}, {"audio", "image"}} {
		after := claimBuffers(t, s, kinds)
		t.Logf("claim %v buffers: %d without the backlog, %d with 50k video tasks ahead", kinds, before, after)
		if after > 2*before+8 {
			t.Fatalf("the claim of %v read %d buffers with another kind's backlog ahead, %d without", kinds, after, before)
		}
	}
}

// claimBuffers runs the worker's claim for kinds under EXPLAIN (ANALYZE,
// BUFFERS) in a transaction it rolls back, and returns the buffers it
// touched.
func claimBuffers(t testing.TB, s *Store, kinds []string) int {
	t.Helper()
	ctx := context.Background()
	w := newWorker(t, s, WorkerConfig{Kinds: kinds, Handler: func(context.Context, Task) Outcome { return Outcome{} }})
	sql, args := w.claimStatement(1)
	var total int
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var plan []map[string]any
		if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args).Scan(&plan); err != nil {
			return err
		}
		top := plan[0]["Plan"].(map[string]any)
		total = int(top["Shared Hit Blocks"].(float64) + top["Shared Read Blocks"].(float64))
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	return total
}

var errRollback = errors.New("roll back")

// claimNow runs the claim of a worker for kinds once, for up to n tasks,
// and commits it: the claimed tasks stay running (no handler runs them).
func claimNow(t testing.TB, s *Store, kinds []string, n int) []Task {
	t.Helper()
	w := newWorker(t, s, WorkerConfig{Kinds: kinds, Handler: func(context.Context, Task) Outcome { return Outcome{} }})
	sql, args := w.claimStatement(n)
	got, err := w.runClaim(context.Background(), sql, args)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// claimShapes are the three claim statements a worker may run: any kind,
// kinds named as literals, and kinds that cannot be literals.
var claimShapes = []struct {
	name  string
	kinds []string
	kind  string // the kind the test's tasks have
}{
	{name: "any kind", kinds: nil, kind: "image"},
	{name: "literal kinds", kinds: []string{"audio", "image"}, kind: "image"},
	{name: "non-literal kind", kinds: []string{"an image's kind"}, kind: "an image's kind"},
}

// A claim for high-priority work reads about as much with a large
// backlog of lower priority of the same kind as without it.
func TestClaimIgnoresLowPriorityBacklog(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	hi := newTask("urgent")
	hi.Priority = 10
	mustSubmit(t, s, hi)
	before := map[string]int{}
	for _, shape := range claimShapes[:2] {
		before[shape.name] = claimBuffers(t, s, shape.kinds)
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after, priority)
		SELECT 'acme', 'o', 'image', 'gpu', 'main', 'low-' || g, 'f', now() - interval '1 hour', g % 5
		FROM generate_series(1, 50000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, "ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
	for _, shape := range claimShapes[:2] {
		after := claimBuffers(t, s, shape.kinds)
		t.Logf("claim (%s) buffers: %d alone, %d with 50k older tasks of lower priority", shape.name, before[shape.name], after)
		if after > 2*before[shape.name]+8 {
			t.Fatalf("the claim (%s) read %d buffers with a lower-priority backlog, %d without", shape.name, after, before[shape.name])
		}
	}
	if got := claimNow(t, s, []string{"image"}, 1); len(got) != 1 || got[0].IdempotencyKey != "urgent" {
		t.Fatalf("claimed %v, want the urgent task", keysOf(got))
	}
}

// At a 100k-task backlog of kind image, the claims stay index reads:
// a claim of image (fair order) and, with image paused (or at its
// MaxRunning), the claim of another kind by a worker that names its
// kinds. A worker of every kind (WorkerConfig.Kinds empty) no longer
// reads the held-back backlog (v10); its figure is logged here for the
// guide (TestAnyKindClaimBesidePausedBacklogReadsNoBacklog holds it).
func TestClaimPlanWithPausedBacklog(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	other := newTask("lone-audio")
	other.Kind = "audio"
	mustSubmit(t, s, other)
	before := map[string]int{}
	shapes := map[string][]string{"any kind": nil, "literal audio": {"audio"}, "literal image": {"image"}}
	for name, kinds := range shapes {
		before[name] = claimBuffers(t, s, kinds)
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after, turn)
		SELECT 'tenant-' || (g % 100), 'o', 'image', 'gpu', 'main', 'bk-' || g, 'f', now() - interval '1 hour', g / 100
		FROM generate_series(1, 100000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, "ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
	img := claimBuffers(t, s, []string{"image"})
	t.Logf("claim of image at a 100k backlog (fair order): %d buffers (%d on an empty queue)", img, before["literal image"])
	if img > 200 {
		t.Errorf("the fair claim read %d buffers at a 100k backlog", img)
	}
	// Then the held-back backlog sorts ahead of the audio task: a higher
	// priority (the order of the any-kind index is priority first).
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET priority = 1 WHERE kind = 'image'`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, "VACUUM ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
	for _, l := range []KindLimits{{Paused: true}, {MaxRunning: 1}} {
		if err := s.SetKindLimits(ctx, "image", l); err != nil {
			t.Fatal(err)
		}
		if l.MaxRunning > 0 {
			claimNow(t, s, []string{"image"}, 1) // image at its limit
		}
		for _, name := range []string{"any kind", "literal audio"} {
			after := claimBuffers(t, s, shapes[name])
			t.Logf("%+v: claim (%s) of the lone audio task: %d buffers; %d on an empty queue", l, name, after, before[name])
			if name == "literal audio" && after > 2*before[name]+50 {
				t.Errorf("%+v: the claim (%s) read %d buffers past image's held-back 100k backlog (%d without)",
					l, name, after, before[name])
			}
		}
	}
}

// A worker of every kind finds the kinds with waiting tasks on the claim
// index itself: a task whose line is missing from idemgate_waiting_tenants
// (written with triggers off, as a data-only restore may write it) is
// claimed all the same, by every claim shape.
func TestClaimOfAnyKindNeedsNoWaitingLine(t *testing.T) {
	t.Parallel()
	for _, shape := range claimShapes {
		t.Run(shape.name, func(t *testing.T) {
			t.Parallel()
			s, _ := setup(t)
			ctx := context.Background()
			nt := newTask("unlisted")
			nt.Kind = shape.kind
			task := mustSubmit(t, s, nt)
			if _, err := s.pool.Exec(ctx, `DELETE FROM idemgate_waiting_tenants`); err != nil {
				t.Fatal(err)
			}
			got := claimNow(t, s, shape.kinds, 4)
			if len(got) != 1 || got[0].ID != task.ID {
				t.Fatalf("claim took %v; want the task whose line is not listed", keysOf(got))
			}
		})
	}
}
