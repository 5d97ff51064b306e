package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/wait"
	"github.com/jackc/pgx/v5"
)

// oddKinds are kind names a client may send that no literal can carry,
// or that sort at the ends of the kinds' order.
var oddKinds = []string{
	"it's", "Ünïcode 种类", " leading space", "trailing space ", "UPPER", `back\slash`, "~",
	`"; DROP TABLE idemgate_tasks; --`, "a", strings.Repeat("x", 300), "\t", "\U0010FFFF",
}

// A worker of every kind takes every due task, whatever its kind's name
// and however many kinds there are (200 and the odd ones), and whatever
// its state: placed, of a higher priority, from before v6 (no turn), a
// retry come due, a scheduled task come due (unplaced, alone in its kind
// or beside placed ones). Each is claimed once.
func TestAnyKindClaimTakesEveryTaskOfManyAndOddKinds(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	kinds := append([]string{}, oddKinds...)
	for i := range 200 {
		kinds = append(kinds, fmt.Sprintf("k%03d", i))
	}
	var batch []NewTask
	for _, kind := range kinds {
		for j := range 2 {
			nt := tenantTask(fmt.Sprintf("tenant-%d", j), fmt.Sprintf("%s/%d", kind, j))
			nt.Kind = kind
			batch = append(batch, nt)
		}
	}
	res, err := s.SubmitMany(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("task %q refused: %v", batch[i].IdempotencyKey, r.Err)
		}
	}
	// Kinds of one task in a state other than placed-and-pending.
	for _, special := range []struct{ kind, update string }{
		{"scheduled-alone", ``}, // turn stays -1
		{"k001", ``},            // unplaced beside placed
		{"pre-v6", `, turn = NULL`},
		{"retry-due", `, state = 'retrying', tries = 1, attempt = 1, turn = 0`},
		{"retry-pre-v6", `, state = 'retrying', tries = 1, attempt = 1, turn = NULL`},
		{"it's", `, priority = 7, turn = 0`},
	} {
		// Submitted for later, then come due: unplaced unless the update
		// places it.
		nt := newTask("special/" + special.kind)
		nt.Kind = special.kind
		nt.RunAfter = time.Now().Add(time.Hour)
		task := mustSubmit(t, s, nt)
		if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET run_after = now() - interval '1 second'`+special.update+`
			WHERE id = $1`, task.ID); err != nil {
			t.Fatal(err)
		}
		batch = append(batch, nt)
	}
	want := map[string]bool{}
	for _, nt := range batch {
		want[nt.Kind+"\x00"+nt.IdempotencyKey] = true
	}
	got := map[string]int{}
	// The task of the highest priority goes first, whatever its kind.
	first := claimNow(t, s, nil, 1)
	if len(first) != 1 || first[0].IdempotencyKey != "special/it's" {
		t.Fatalf("the first claim of any kind took %v; want the task of priority 7", keysOf(first))
	}
	// A worker of a literal and a non-literal kind takes theirs only.
	mixed := claimNow(t, s, []string{"Ünïcode 种类", "k010"}, 16)
	for _, task := range append(first, mixed...) {
		got[task.Kind+"\x00"+task.IdempotencyKey]++
		if task.Kind != "it's" && task.Kind != "Ünïcode 种类" && task.Kind != "k010" {
			t.Errorf("a worker of Ünïcode 种类 and k010 claimed %q of kind %q", task.IdempotencyKey, task.Kind)
		}
	}
	if len(mixed) != 4 {
		t.Errorf("a worker of Ünïcode 种类 and k010 claimed %v; want their 4 tasks", keysOf(mixed))
	}
	for range 2 * len(batch) {
		claimed := claimNow(t, s, nil, 16)
		if len(claimed) == 0 {
			break
		}
		for _, task := range claimed {
			got[task.Kind+"\x00"+task.IdempotencyKey]++
		}
	}
	for key := range want {
		if got[key] != 1 {
			t.Errorf("task %q was claimed %d times; want once", key, got[key])
		}
	}
	if len(got) != len(want) {
		t.Errorf("claimed %d distinct tasks; want %d", len(got), len(want))
	}
}

// A claim of one task by a worker of every kind locks what it may take,
// not one task of every kind: while its transaction is open, a second
// worker (of every kind, or of one of the other kinds) still takes the
// other kinds' due tasks. Before v10 the claim of any kind read one
// index under LIMIT and locked @limit rows.
func TestAnyKindClaimOfOneLeavesOtherKindsToConcurrentClaims(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	const kinds = 20
	var batch []NewTask
	for i := range kinds {
		nt := newTask(fmt.Sprintf("one-of-k%02d", i))
		nt.Kind = fmt.Sprintf("k%02d", i)
		batch = append(batch, nt)
	}
	if _, err := s.SubmitMany(ctx, batch); err != nil {
		t.Fatal(err)
	}
	first := newWorker(t, s, WorkerConfig{Handler: func(context.Context, Task) Outcome { return Outcome{} }})
	sql, args := first.claimStatement(1)
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, _ := tx.Query(ctx, sql, args)
	took, err := pgx.CollectRows(rows, pgx.RowToStructByName[Task])
	if err != nil || len(took) != 1 {
		t.Fatalf("first claim: %v, %v; want one task", keysOf(took), err)
	}
	var lockable int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT id FROM idemgate_tasks
		WHERE state IN ('pending', 'retrying') FOR UPDATE SKIP LOCKED) x`).Scan(&lockable); err != nil {
		t.Fatal(err)
	}
	t.Logf("an open claim of 1 task of any kind leaves %d of %d waiting tasks lockable", lockable, kinds-1)
	other := "k00"
	if took[0].Kind == other {
		other = "k01"
	}
	if got := claimNow(t, s, []string{other}, 1); len(got) != 1 {
		t.Errorf("a worker of kind %s claimed %d tasks while another worker's claim of 1 was open; want 1", other, len(got))
	}
	if got := claimNow(t, s, nil, 5); len(got) != 5 {
		t.Errorf("a second worker of every kind claimed %d tasks while another's claim of 1 was open; want 5 of %d", len(got), kinds-2)
	}
}

// A worker of a kind that cannot be a literal reads its own kind only: an
// open claim of it locks no task of another kind.
func TestNonLiteralKindClaimLocksNoOtherKind(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	for _, kind := range []string{"image", "it's", "zzz"} {
		nt := newTask("one-of-" + kind)
		nt.Kind = kind
		mustSubmit(t, s, nt)
	}
	w := newWorker(t, s, WorkerConfig{Kinds: []string{"it's"}, Handler: func(context.Context, Task) Outcome { return Outcome{} }})
	sql, args := w.claimStatement(4)
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, _ := tx.Query(ctx, sql, args)
	took, err := pgx.CollectRows(rows, pgx.RowToStructByName[Task])
	if err != nil || len(took) != 1 || took[0].Kind != "it's" {
		t.Fatalf("claim of it's: %v, %v; want its one task", keysOf(took), err)
	}
	if got := claimNow(t, s, []string{"image", "zzz"}, 4); len(got) != 2 {
		t.Fatalf("claimed %v beside an open claim of kind it's; want image's and zzz's tasks", keysOf(got))
	}
}

// The claim of every kind, run as pgx runs it (a statement prepared once
// on the connection and run again and again, so that after five runs
// Postgres may plan it generically, or always under
// plan_cache_mode=force_generic_plan), reads each kind on an index: no
// sequential scan of the tasks and about the heap blocks of its first
// (custom) plan, beside a 30k backlog of one kind and a paused kind's 30k.
func TestAnyKindClaimGenericPlanReadsEachKindOnItsIndex(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	ctx := context.Background()
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after, turn)
		SELECT 'tenant-' || (g % 50), 'o', k, 'gpu', 'main', k || '-' || g, 'f', now() - interval '1 hour', g / 50
		FROM generate_series(1, 30000) g, (VALUES ('big'), ('paused')) v(k)`); err != nil {
		t.Fatal(err)
	}
	mustSubmit(t, s, tenantTask("lone", "the-small-one"))
	if _, err := s.pool.Exec(ctx, "ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
	args := pgx.NamedArgs{"limit": 4, "lease_us": int64(time.Minute / time.Microsecond), "worker": "w",
		"held": nil, "uncertain_kinds": nil, "kinds": nil}
	for _, c := range []struct{ name, sql string }{
		{"free", claimFreeSQL(nil)},
		{"limited", claimRunnableSQL(nil)},
	} {
		if c.name == "limited" {
			// Free claims claim nothing once a kind has limits.
			if err := s.SetKindLimits(ctx, "paused", KindLimits{Paused: true}); err != nil {
				t.Fatal(err)
			}
		}
		for _, mode := range []string{"auto", "force_generic_plan"} {
			runs := runPrepared(t, db, c.sql, args, mode)
			first, last := runs[0], runs[len(runs)-1]
			t.Logf("%s claim of any kind, %s: first run %+v, last %+v", c.name, mode, first, last)
			if last.claimed == 0 {
				t.Errorf("the %s claim of any kind, %s, claimed nothing", c.name, mode)
			}
			if last.seqScans > 0 || last.heapBlocks > 2*first.heapBlocks+50 {
				t.Errorf("the %s claim of any kind, %s, after %d runs (%d of them generic): %d sequential scans of the tasks, %d heap blocks; %d at its first run",
					c.name, mode, len(runs), last.generic, last.seqScans, last.heapBlocks, first.heapBlocks)
			}
		}
	}
}

// preparedRun is what one run of a prepared claim did.
type preparedRun struct {
	claimed, seqScans, heapBlocks, generic int
}

// runPrepared runs sql twelve times on a new connection under
// plan_cache_mode mode, as pgx's statement cache runs it (prepared once),
// each run after the claim's locks and rolled back, and returns what each
// run did: rows returned, sequential scans and heap blocks of the tasks,
// and the generic plans the statement had had by then.
func runPrepared(t *testing.T, db testDB, sql string, args pgx.NamedArgs, mode string) []preparedRun {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
		t.Fatal(err)
	}
	var runs []preparedRun
	for range 12 {
		var r preparedRun
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sqlLockLimitedKinds, pgx.NamedArgs{"kinds": nil}); err != nil {
				return err
			}
			var seq0, blocks0 int
			if err := tx.QueryRow(ctx, `SELECT coalesce(seq_scan, 0), pg_stat_get_xact_blocks_fetched('idemgate_tasks'::regclass)
				FROM pg_stat_xact_user_tables WHERE relname = 'idemgate_tasks'`).Scan(&seq0, &blocks0); err != nil {
				return err
			}
			rows, _ := tx.Query(ctx, sql, args)
			got, err := pgx.CollectRows(rows, pgx.RowToStructByName[Task])
			if err != nil {
				return err
			}
			r.claimed = len(got)
			if err := tx.QueryRow(ctx, `SELECT coalesce(seq_scan, 0) - $1, pg_stat_get_xact_blocks_fetched('idemgate_tasks'::regclass) - $2
				FROM pg_stat_xact_user_tables WHERE relname = 'idemgate_tasks'`, seq0, blocks0).Scan(&r.seqScans, &r.heapBlocks); err != nil {
				return err
			}
			return errRollback
		})
		if !errors.Is(err, errRollback) {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, `SELECT coalesce(max(generic_plans), 0) FROM pg_prepared_statements
			WHERE statement LIKE '%picked AS (%'`).Scan(&r.generic); err != nil {
			t.Fatal(err)
		}
		runs = append(runs, r)
	}
	return runs
}

// Workers of every kind on three pools keep a kind's MaxRunning and
// MaxRunningPerTenant exact, start nothing of a paused kind, and run
// every task of a kind without limits beside them.
func TestAnyKindWorkersKeepLimitsAcrossPools(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	ctx := context.Background()
	attemptLog(t, s.pool)
	const maxRunning, perTenant = 3, 1
	if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunning: maxRunning, MaxRunningPerTenant: perTenant}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetKindLimits(ctx, "frozen", KindLimits{Paused: true}); err != nil {
		t.Fatal(err)
	}
	var batch []NewTask
	for i := range 48 {
		batch = append(batch, tenantTask(fmt.Sprintf("tenant-%d", i%4), fmt.Sprintf("limited-%d", i)))
	}
	for i := range 24 {
		nt := tenantTask(fmt.Sprintf("tenant-%d", i%4), fmt.Sprintf("free-%d", i))
		nt.Kind = "free's"
		batch = append(batch, nt)
	}
	for i := range 6 {
		nt := newTask(fmt.Sprintf("frozen-%d", i))
		nt.Kind = "frozen"
		batch = append(batch, nt)
	}
	if _, err := s.SubmitMany(ctx, batch); err != nil {
		t.Fatal(err)
	}
	var frozenRan atomic.Int64
	cfg := WorkerConfig{Concurrency: 8, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
		Handler: func(ctx context.Context, task Task) Outcome {
			if task.Kind == "frozen" {
				frozenRan.Add(1)
			}
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Millisecond):
			}
			return Succeeded(json.RawMessage(`1`))
		}}
	for range 3 {
		runWorker(t, newWorker(t, newStore(db.pool(t)), cfg))
	}
	wait.For(t, patience, "every task of image and free's succeeded", func() bool {
		return countRows(t, s.pool, "state = 'succeeded'") == 72
	})
	if n := frozenRan.Load(); n != 0 || countRows(t, s.pool, "kind = 'frozen' AND state = 'pending'") != 6 {
		t.Fatalf("%d tasks of the paused kind ran", n)
	}
	ivs := attemptIntervals(t, s.pool)
	rows, _ := s.pool.Query(ctx, `SELECT DISTINCT tenant FROM idemgate_tasks WHERE kind = 'image'`)
	tenants, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	image := imageIntervals(t, s)
	if got := maxOverlap(image, ""); got > maxRunning {
		t.Fatalf("%d attempts of image held a lease at once; want ≤ MaxRunning %d", got, maxRunning)
	}
	for _, tenant := range tenants {
		if got := maxOverlap(image, tenant); got > perTenant {
			t.Fatalf("%s had %d attempts of image at once; want ≤ MaxRunningPerTenant %d", tenant, got, perTenant)
		}
	}
	t.Logf("%d attempts; image at most %d at once", len(ivs), maxOverlap(image, ""))
}

// imageIntervals are the attempt intervals of the tasks of kind image.
func imageIntervals(t *testing.T, s *Store) []interval {
	t.Helper()
	if _, err := s.pool.Exec(context.Background(), `DELETE FROM idemgate_test_attempts a
		USING idemgate_tasks t WHERE t.id = a.id AND t.kind <> 'image'`); err != nil {
		t.Fatal(err)
	}
	return attemptIntervals(t, s.pool)
}

// A kind whose waiting tasks are all retries backing off (placed, due in
// an hour) costs a worker of every kind no read of them: its claim of
// another kind's due task reads about what a worker of that kind reads.
func TestAnyKindClaimIgnoresAKindsBackingOffRetries(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	mustSubmit(t, s, newTask("the-due-one"))
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after, turn, state, tries, attempt)
		SELECT 'tenant-' || (g % 50), 'o', 'flaky', 'gpu', 'main', 'flaky-' || g, 'f', now() + interval '1 hour', g / 50,
			'retrying', 1, 1
		FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, "ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
	named := claimBuffers(t, s, []string{"image"})
	anyKind := claimBuffers(t, s, nil)
	t.Logf("claim buffers beside 20k backing-off retries of another kind: %d by a worker of image, %d by a worker of every kind", named, anyKind)
	if anyKind > 2*named+16 {
		t.Fatalf("a worker of every kind read %d buffers to claim image's due task beside 20k retries backing off; a worker of image read %d", anyKind, named)
	}
	if got := claimNow(t, s, nil, 4); len(got) != 1 || got[0].IdempotencyKey != "the-due-one" {
		t.Fatalf("claimed %v; want the due task only", keysOf(got))
	}
}

// A claim of one task by a worker of every kind takes the kinds in turn,
// so it reads the head of each kind with waiting tasks: one skip to the
// kind and one descent of its line, a few buffers a kind (docs/queue.md),
// never the kinds' backlogs. It locks only what it takes (logged: the
// WAL of a claim of 1 beside 200 kinds, which locked a row of every kind
// when each kind's read locked its rows).
func TestAnyKindClaimCostPerKind(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	insert := func(kinds, each int) {
		t.Helper()
		if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
			(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after, turn)
			SELECT 'tenant-' || (g % 5), 'o', 'k' || k, 'gpu', 'main', 'k' || k || '-' || g, 'f', now() - interval '1 hour', g / 5
			FROM generate_series(1, $1::int) k, generate_series(1, $2::int) g`, kinds, each); err != nil {
			t.Fatal(err)
		}
		if _, err := s.pool.Exec(ctx, "ANALYZE idemgate_tasks"); err != nil {
			t.Fatal(err)
		}
	}
	// walOfClaim is the WAL a committed claim of 1 writes (its row locks
	// are written too); the WAL is the cluster's, so the figure is only
	// the claim's when the test runs alone. Logged, never asserted.
	walOfClaim := func() int {
		t.Helper()
		var before, after string
		if err := s.pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&before); err != nil {
			t.Fatal(err)
		}
		if got := claimNow(t, s, nil, 1); len(got) != 1 {
			t.Fatalf("claimed %v; want one task", keysOf(got))
		}
		var n int
		if err := s.pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&after); err != nil {
			t.Fatal(err)
		}
		if err := s.pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::int", after, before).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	insert(1, 1000)
	one := claimBuffers(t, s, nil)
	oneWAL := walOfClaim()
	if _, err := s.pool.Exec(ctx, "DELETE FROM idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
	insert(200, 5)
	many := claimBuffers(t, s, nil)
	manyWAL := walOfClaim()
	t.Logf("an any-kind claim of 1 read %d buffers with 1 kind of 1000 tasks waiting, %d with 200 kinds of 5", one, many)
	t.Logf("and wrote %d bytes of WAL with 1 kind, %d with 200", oneWAL, manyWAL)
	if many > one+20*200 {
		t.Fatalf("an any-kind claim of 1 read %d buffers with 200 kinds waiting, %d with one: more than 20 a kind", many, one)
	}
}

// Migration v10 killed while its DROP INDEX CONCURRENTLY waits for an
// older transaction, with workers of every kind claiming and Submits
// running throughout: the index is left invalid, nothing stops, the
// rerun drops it, and every task runs once.
func TestMigrateV10KilledMidDropWhileAnyKindWorkersClaim(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	admin := db.pool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s := newStore(db.pool(t))
	s.test = &storeTestHooks{migrateSkip: []int{10}}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var c calls
	cfg := WorkerConfig{Concurrency: 4, Handler: func(_ context.Context, task Task) Outcome {
		c.add(task.ID)
		return Succeeded(json.RawMessage(`1`))
	}}
	for range 2 {
		runWorker(t, newWorker(t, newStore(db.pool(t)), cfg))
	}
	var submitted atomic.Int64
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		sub := newStore(db.pool(t))
		for n := 0; ; n++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			nt := tenantTask(fmt.Sprintf("tenant-%d", n%3), fmt.Sprintf("m-%d", n))
			nt.Kind = fmt.Sprintf("kind-%d", n%5)
			if _, err := sub.Submit(ctx, nt); err != nil {
				done <- err
				return
			}
			submitted.Add(1)
		}
	}()
	wait.For(t, patience, "submits run", func() bool { return submitted.Load() > 50 })
	blocker, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := blocker.Exec(ctx, `SELECT FROM idemgate_tasks LIMIT 1`); err != nil {
		t.Fatal(err)
	}
	killed := make(chan struct{})
	s.test = &storeTestHooks{migrateStep: func(_ context.Context, step string, pid uint32) {
		if step != "v10: drop v8's runnable index concurrently" {
			return
		}
		go func() {
			defer close(killed)
			if !wait.Until(patience, func() bool {
				var waiting bool
				err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock')`,
					int(pid)).Scan(&waiting)
				return err == nil && waiting
			}) {
				t.Error("the drop never waited")
			}
			before := submitted.Load()
			if !wait.Until(patience, func() bool { return submitted.Load() > before+50 }) {
				t.Error("submits stalled while the drop waited")
			}
			terminate(t, admin, pid)
		}()
	}}
	if err := s.Migrate(ctx); err == nil {
		t.Fatal("Migrate succeeded although killed mid-drop")
	}
	<-killed
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var valid *bool
	if err := admin.QueryRow(ctx, `SELECT (SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE c.relname = $1)`, indexRunnableV8).Scan(&valid); err != nil {
		t.Fatal(err)
	}
	if valid == nil || *valid {
		t.Fatalf("the kill did not land mid-drop: %s valid %v", indexRunnableV8, valid)
	}
	s.test = nil
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("rerun: %v", err)
	}
	var left bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_class WHERE relname = $1)`, indexRunnableV8).Scan(&left); err != nil || left {
		t.Fatalf("the rerun left %s: %v, %v", indexRunnableV8, left, err)
	}
	before := submitted.Load()
	wait.For(t, patience, "submits go on after the migration", func() bool { return submitted.Load() > before+50 })
	close(stop)
	if err := <-done; err != nil {
		t.Fatalf("a submit failed: %v", err)
	}
	assertFinalSchema(t, admin)
	wait.For(t, patience, "every task succeeded", func() bool {
		return countRows(t, admin, "state = 'succeeded'") == int(submitted.Load())
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, n := range c.n {
		if n != 1 {
			t.Errorf("task %s ran %d times", id, n)
		}
	}
}

// A worker of every kind reads no task of a kind without room: beside a
// paused kind's 30k backlog and the 30k backlog of a kind at its
// MaxRunning, its claim of image's one due task reads about what a
// worker of image reads.
func TestAnyKindClaimSkipsKindsWithoutRoomUnread(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after, turn)
		SELECT 'tenant-' || (g % 50), 'o', k, 'gpu', 'main', k || '-' || g, 'f', now() - interval '1 hour', g / 50
		FROM generate_series(1, 30000) g, (VALUES ('paused'), ('full')) v(k)`); err != nil {
		t.Fatal(err)
	}
	if err := s.SetKindLimits(ctx, "paused", KindLimits{Paused: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetKindLimits(ctx, "full", KindLimits{MaxRunning: 1}); err != nil {
		t.Fatal(err)
	}
	if got := claimNow(t, s, []string{"full"}, 1); len(got) != 1 {
		t.Fatalf("claimed %v of kind full; want one, to fill its MaxRunning", keysOf(got))
	}
	mustSubmit(t, s, newTask("the-due-one"))
	if _, err := s.pool.Exec(ctx, "ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
	named := limitedClaimBuffers(t, s, []string{"image"})
	anyKind := limitedClaimBuffers(t, s, nil)
	t.Logf("limited claim buffers beside a paused and a full kind's 30k: %d by a worker of image, %d by a worker of every kind", named, anyKind)
	if anyKind > 2*named+16 {
		t.Fatalf("a worker of every kind read %d buffers beside two kinds without room; a worker of image read %d", anyKind, named)
	}
}

// limitedClaimBuffers runs the limited claim of kinds (the statement a
// worker runs once a kind has limits) after its locks, under EXPLAIN
// (ANALYZE, BUFFERS), rolled back, and returns the buffers it touched.
func limitedClaimBuffers(t *testing.T, s *Store, kinds []string) int {
	t.Helper()
	ctx := context.Background()
	var total int
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlLockLimitedKinds, pgx.NamedArgs{"kinds": kinds}); err != nil {
			return err
		}
		var plan []map[string]any
		args := pgx.NamedArgs{"limit": 4, "lease_us": int64(time.Minute / time.Microsecond), "worker": "w",
			"held": nil, "uncertain_kinds": nil, "kinds": kinds}
		if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+claimRunnableSQL(kinds), args).Scan(&plan); err != nil {
			return err
		}
		top := plan[0]["Plan"].(map[string]any)
		// image's task, and a held-back mark of each kind without room
		// that a worker of that kind serves.
		want := 1
		if len(kinds) == 0 {
			want = 3
		}
		if n := int(top["Actual Rows"].(float64)); n != want {
			t.Errorf("the limited claim of %v returned %d rows; want %d", kinds, n, want)
		}
		total = int(top["Shared Hit Blocks"].(float64) + top["Shared Read Blocks"].(float64))
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	return total
}
