package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// orphanLines counts the lines (kind, priority, tenant) with a placed
// waiting task that idemgate_waiting_tenants does not list, on one
// snapshot: a claim's walk would never find their tenants.
func orphanLines(t testing.TB, s *Store) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM (
		SELECT DISTINCT kind, priority, tenant FROM idemgate_tasks t
		WHERE state IN ('pending', 'retrying') AND (turn IS NULL OR turn >= 0)
			AND NOT EXISTS (SELECT FROM idemgate_waiting_tenants w
				WHERE w.kind = t.kind AND w.priority = t.priority AND w.tenant = t.tenant)) o`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitingLines lists idemgate_waiting_tenants as "kind/priority/tenant".
func waitingLines(t testing.TB, s *Store) []string {
	t.Helper()
	rows, _ := s.pool.Query(context.Background(), `SELECT kind || '/' || priority || '/' || tenant
		FROM idemgate_waiting_tenants ORDER BY 1`)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

// sweepAll sweeps idemgate_waiting_tenants from its first line to its
// last.
func sweepAll(t testing.TB, s *Store) {
	t.Helper()
	r := &rescuer{pool: s.pool}
	for first := true; first || r.after != (waitingLine{}); first = false {
		if _, err := r.sweepWaiting(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// Every way a task comes to wait lists its line, and a sweep removes a
// line only once no task of it waits: a due task, a task scheduled for
// later (listed once a claim gives it its turn), a retry waiting for its
// backoff, a task whose line was swept while it was empty, a finished one.
func TestWaitingTenantsListTheLinesWithWork(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	mustSubmit(t, s, tenantTask("due", "d-1"))
	later := tenantTask("later", "l-1")
	later.RunAfter = time.Now().Add(time.Hour)
	mustSubmit(t, s, later)
	done := mustSubmit(t, s, tenantTask("done", "x-1"))
	retry := mustSubmit(t, s, tenantTask("retry", "r-1"))
	hi := tenantTask("due", "d-hi")
	hi.Priority = 5
	mustSubmit(t, s, hi)
	if want := []string{"image/0/done", "image/0/due", "image/0/retry", "image/5/due"}; !slices.Equal(waitingLines(t, s), want) {
		t.Fatalf("after Submits: %v; want %v (a scheduled task takes no turn: not listed)", waitingLines(t, s), want)
	}
	// done's task ends; retry's waits for a backoff.
	for _, sql := range []string{
		`UPDATE idemgate_tasks SET state = 'succeeded', finished_at = now() WHERE id = $1::uuid`,
		`UPDATE idemgate_tasks SET state = 'retrying', run_after = now() + interval '1 hour' WHERE id = $1::uuid`,
	} {
		id := done.ID
		if strings.Contains(sql, "retrying") {
			id = retry.ID
		}
		if _, err := s.pool.Exec(ctx, sql, id); err != nil {
			t.Fatal(err)
		}
	}
	sweepAll(t, s)
	if want := []string{"image/0/due", "image/0/retry", "image/5/due"}; !slices.Equal(waitingLines(t, s), want) {
		t.Fatalf("after a sweep: %v; want %v", waitingLines(t, s), want)
	}
	// later's task comes due: a claim gives it its turn (and may take it).
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET run_after = now() - interval '1 second' WHERE tenant = 'later'`); err != nil {
		t.Fatal(err)
	}
	claimNow(t, s, []string{"other-kind"}, 1) // places every due scheduled task, claims none of image
	if got := waitingLines(t, s); !slices.Contains(got, "image/0/later") {
		t.Fatalf("after its task was placed: %v; want later listed", got)
	}
	// done's line comes back with a new task.
	mustSubmit(t, s, tenantTask("done", "x-2"))
	if n := orphanLines(t, s); n != 0 {
		t.Fatalf("%d lines with waiting tasks are not listed: %v", n, waitingLines(t, s))
	}
}

// Writers and sweeps race: each writer submits a task of its line in a
// transaction it holds open a moment (the task inserted, its line found
// listed, the commit not yet made) and then ends the task, so that its
// line is empty in between and the sweep keeps trying to remove it. A
// sweep that read the line empty on a snapshot taken before the writer's
// commit, without the writer's lock, would remove the row of a line
// whose task then commits: a tenant the claim's walk never finds.
func TestWaitingTenantsSurviveSweepsRacingWriters(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	const writers, rounds = 4, 60
	var wg sync.WaitGroup
	var stop atomic.Bool
	var sweeps atomic.Int64
	sweepErr := make(chan error, 1)
	go func() {
		r := &rescuer{pool: s.pool}
		for !stop.Load() {
			if _, err := r.sweepWaiting(ctx); err != nil {
				sweepErr <- err
				return
			}
			sweeps.Add(1)
		}
		sweepErr <- nil
	}()
	var orphans atomic.Int64
	for g := range writers {
		wg.Go(func() {
			for i := range rounds {
				nt := tenantTask(fmt.Sprintf("w-%d", g), fmt.Sprintf("k-%d-%d", g, i))
				var id string
				err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
					task, err := s.SubmitTx(ctx, tx, nt)
					id = task.ID
					time.Sleep(time.Duration(i%4) * time.Millisecond)
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
				if n := orphanLines(t, s); n != 0 {
					orphans.Add(int64(n))
				}
				if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'succeeded', finished_at = now()
					WHERE id = $1::uuid`, id); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	stop.Store(true)
	if err := <-sweepErr; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d sweeps beside %d writers x %d rounds", sweeps.Load(), writers, rounds)
	if n := orphans.Load(); n != 0 {
		t.Fatalf("%d times a line with a committed waiting task was not listed", n)
	}
	sweepAll(t, s)
	if got := waitingLines(t, s); len(got) != 0 {
		t.Fatalf("lines left after every task ended and a full sweep: %v", got)
	}
}

// Migrating a v8 database lists the lines that already have waiting
// tasks, and only those: placed due tasks, tasks from before v6 (no
// turn), retries; not scheduled tasks (turn -1), running or finished ones.
func TestMigrateToV9ListsTheLinesWithWork(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx := context.Background()
	s := newStore(db.pool(t))
	s.test = &storeTestHooks{migrateSkip: []int{9, 11}}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, state, priority, turn, run_after)
		VALUES ('due', 'o', 'image', 'r', 'n', 'k1', 'f', 'pending', 0, 3, now()),
			('due', 'o', 'image', 'r', 'n', 'k2', 'f', 'pending', 0, 4, now()),
			('old', 'o', 'image', 'r', 'n', 'k3', 'f', 'pending', 2, NULL, now()),
			('retry', 'o', 'audio', 'r', 'n', 'k4', 'f', 'retrying', 0, 1, now() + interval '1 hour'),
			('later', 'o', 'image', 'r', 'n', 'k5', 'f', 'pending', 0, -1, now() + interval '1 day'),
			('busy', 'o', 'image', 'r', 'n', 'k6', 'f', 'running', 0, 0, now()),
			('gone', 'o', 'image', 'r', 'n', 'k7', 'f', 'succeeded', 0, 0, now())`); err != nil {
		t.Fatal(err)
	}
	s.test = nil
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{"audio/0/retry", "image/0/due", "image/2/old"}
	if got := waitingLines(t, s); !slices.Equal(got, want) {
		t.Fatalf("after v9: %v; want %v", got, want)
	}
	mustSubmit(t, s, tenantTask("new", "k8"))
	if got := waitingLines(t, s); !slices.Contains(got, "image/0/new") {
		t.Fatalf("a Submit after v9 is not listed: %v", got)
	}
}

// Another tenant's work beside work that limits keep waiting, black box:
// the time from submitting 16 tasks of 16 tenants to the start of the
// last of them by a running worker (16 slots; kinds image at
// MaxRunningPerTenant 1 and video, paused), median of rounds, as a ratio
// of the same on a queue with nothing else in it, measured in the same
// run: beside 1,000 tenants x 50 tasks of image each at its limit, beside
// 20k tasks of the paused kind, and beside another tenant's 100k image
// tasks scheduled for tomorrow. Fails above 2x (issue #30's target).
//
//	PGSTORE_MEASURE=1 go test -count=1 -v -run TestMeasureOtherTenantsBesideLimitedWork ./pgstore/
func TestMeasureOtherTenantsBesideLimitedWork(t *testing.T) {
	measuring(t)
	ctx := context.Background()
	const rounds = 7
	cases := []struct {
		name  string
		build func(*Store)
	}{
		{"small queue (baseline)", func(*Store) {}},
		{"1,000 tenants x 50 at MaxRunningPerTenant", func(s *Store) { cappedBacklog(t, s, 1000, 0, 50) }},
		{"paused kind's 20k tasks", func(s *Store) {
			if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
				(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, turn)
				SELECT 'v-' || g % 100, 'o', 'video', 'gpu', 'main', 'v-' || g, 'f', g / 100 FROM generate_series(0, 19999) g`); err != nil {
				t.Fatal(err)
			}
		}},
		{"100k scheduled tasks", func(s *Store) {
			if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
				(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after, turn)
				SELECT 'planner', 'o', 'image', 'gpu', 'main', 's-' || g, 'f', now() + interval '1 day', `+unplaced+`
				FROM generate_series(1, 100000) g`); err != nil {
				t.Fatal(err)
			}
		}},
	}
	var base time.Duration
	for _, c := range cases {
		s, _ := setup(t)
		c.build(s)
		if _, err := s.pool.Exec(ctx, "ANALYZE idemgate_tasks"); err != nil {
			t.Fatal(err)
		}
		if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunningPerTenant: 1}); err != nil {
			t.Fatal(err)
		}
		if err := s.SetKindLimits(ctx, "video", KindLimits{Paused: true}); err != nil {
			t.Fatal(err)
		}
		var started atomic.Int64
		all := make(chan struct{}, 1)
		w := newWorker(t, s, WorkerConfig{Kinds: []string{"image", "video"}, Concurrency: 16, PollInterval: time.Second,
			Handler: func(_ context.Context, task Task) Outcome {
				if strings.HasPrefix(task.Tenant, "free-") && started.Add(1) == 16 {
					all <- struct{}{}
				}
				return Succeeded(json.RawMessage(`1`))
			}})
		stop := runWorker(t, w)
		var took []time.Duration
		for r := range rounds {
			started.Store(0)
			begin := time.Now()
			batch := make([]NewTask, 16)
			for i := range batch {
				batch[i] = tenantTask(fmt.Sprintf("free-%d", i), fmt.Sprintf("free-%d-%d", r, i))
			}
			if _, err := s.SubmitMany(ctx, batch); err != nil {
				t.Fatal(err)
			}
			select {
			case <-all:
			case <-time.After(patience):
				t.Fatalf("%s: %d of 16 started", c.name, started.Load())
			}
			took = append(took, time.Since(begin))
			time.Sleep(50 * time.Millisecond) // the round's outcomes written
		}
		stop()
		slices.Sort(took)
		med := took[len(took)/2]
		if base == 0 {
			base = med
		}
		ratio := float64(med) / float64(base)
		t.Logf("%-42s median %7v of %d rounds: %.2fx (load %s)", c.name+":", med.Round(10*time.Microsecond), rounds, ratio, loadavg())
		if ratio > 2 {
			t.Errorf("%s: another tenant's 16 tasks took %.2fx the small queue's time (target <= 2x)", c.name, ratio)
		}
	}
}

// loadavg is the machine's load average over 1, 5 and 15 minutes, as
// /proc/loadavg has it ("?" where there is none).
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// One statement writes the first tasks of 20,000 tenants (an import, a
// backfill by hand) and lists every line, under at most 64 locks. (One
// lock a line also passed here: the test server's lock table borrows
// from spare shared memory; the bound is for servers with many such
// statements at once.)
func TestWaitingTenantsOfAHugeStatement(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, turn)
		SELECT 'huge-' || g, 'o', 'image', 'gpu', 'main', 'h-' || g, 'f', 0 FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM idemgate_waiting_tenants`).Scan(&n); err != nil || n != 20000 {
		t.Fatalf("%d lines listed (%v); want 20000", n, err)
	}
}

// Two handlers' transactions each submit tasks of two tenants new to the
// queue, in opposite orders, and commit: both commit. When a transaction
// listed a new line itself, each held a line the other wanted: one got
// deadlock_detected.
func TestSubmitTxOfNewLinesInOppositeOrders(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	for round := range 3 {
		ctx := hangBound(t)
		a, b := fmt.Sprintf("a-%d", round), fmt.Sprintf("b-%d", round)
		var first sync.WaitGroup
		first.Add(2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i, order := range [][2]string{{a, b}, {b, a}} {
			wg.Go(func() {
				errs[i] = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
					_, err := s.SubmitTx(ctx, tx, tenantTask(order[0], fmt.Sprintf("first-%d", i)))
					first.Done()
					if err != nil {
						return err
					}
					first.Wait() // both hold their first line before either takes its second
					_, err = s.SubmitTx(ctx, tx, tenantTask(order[1], fmt.Sprintf("second-%d", i)))
					return err
				})
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, transaction %d: %v", round, i, err)
			}
		}
	}
	if n := orphanLines(t, s); n != 0 {
		t.Fatalf("%d lines with waiting tasks are not listed", n)
	}
}
