package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/wait"
)

// keyIndex is a unique index of the tasks table as the catalog has it.
type keyIndex struct {
	Name    string   `db:"name"`
	Usable  bool     `db:"usable"`
	Columns []string `db:"columns"`
}

func keyIndexes(t testing.TB, pool *pgxpool.Pool) []keyIndex {
	t.Helper()
	rows, _ := pool.Query(context.Background(), `SELECT c.relname::text AS name,
	i.indisvalid AND i.indisready AS usable,
	array_agg(a.attname::text ORDER BY k.ord) AS columns
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = to_regclass('idemgate_tasks') AND i.indisunique AND NOT i.indisprimary
GROUP BY c.relname, i.indisvalid, i.indisready ORDER BY 1`)
	idx, err := pgx.CollectRows(rows, pgx.RowToStructByName[keyIndex])
	if err != nil {
		t.Fatal(err)
	}
	return idx
}

// assertKeyGuarded checks the invariant that holds whenever a migration
// dies: if the table exists, a valid unique index covers
// (tenant, idempotency_key) or is v12's on the full key's digest, and the
// database refuses a second row with the same full key.
func assertKeyGuarded(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('idemgate_tasks') IS NOT NULL`).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if !exists {
		return
	}
	idx := keyIndexes(t, pool)
	guarded := slices.ContainsFunc(idx, func(k keyIndex) bool {
		if k.Name == indexKeyDigest {
			return k.Usable && slices.Equal(k.Columns, []string{"key_digest"})
		}
		return k.Usable && slices.Contains(k.Columns, "tenant") && slices.Contains(k.Columns, "idempotency_key") &&
			!slices.ContainsFunc(k.Columns, func(c string) bool {
				return !slices.Contains([]string{"tenant", "idempotency_key", "runtime", "network"}, c)
			})
	})
	if !guarded {
		t.Fatalf("no valid unique index covers (tenant, idempotency_key): %+v", idx)
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for range 2 {
			if _, err := tx.Exec(ctx, `INSERT INTO idemgate_tasks
				(tenant, owner, kind, runtime, network, idempotency_key, fingerprint)
				VALUES ('guard', 'o', 'k', 'r', 'n', 'guard-key', 'f')`); err != nil {
				return err
			}
		}
		return errors.New("second insert of one key succeeded")
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("inserting one key twice: %v; want a unique violation", err)
	}
}

// assertFinalSchema checks the schema after a complete migration.
func assertFinalSchema(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	want := []keyIndex{{Name: indexKeyDigest, Usable: true, Columns: []string{"key_digest"}}}
	if got := keyIndexes(t, pool); !slicesEqualFunc(got, want) {
		t.Fatalf("unique indexes = %+v; want %+v", got, want)
	}
	rows, _ := pool.Query(context.Background(), `SELECT version FROM idemgate_schema_migrations ORDER BY version`)
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	var all []int
	for _, m := range migrations {
		all = append(all, m.Version)
	}
	if !slices.Equal(versions, all) {
		t.Fatalf("applied versions = %v; want %v", versions, all)
	}
	var invalid int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_index
		WHERE indrelid = to_regclass('idemgate_tasks') AND NOT (indisvalid AND indisready)`).Scan(&invalid); err != nil {
		t.Fatal(err)
	}
	if invalid != 0 {
		t.Fatalf("%d invalid indexes left on the table", invalid)
	}
	// The indexes every insert writes, and those of other states: v10
	// dropped the any-kind runnable index.
	rows, _ = pool.Query(context.Background(), `SELECT indexrelid::regclass::text FROM pg_index
		WHERE indrelid = to_regclass('idemgate_tasks') ORDER BY 1`)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	wantNames := []string{"idemgate_tasks_claim_v8", "idemgate_tasks_done", indexKeyDigest, "idemgate_tasks_leased",
		"idemgate_tasks_pkey", indexScheduled, indexTenantTurn, "idemgate_tasks_uncertain"}
	slices.Sort(wantNames)
	if !slices.Equal(names, wantNames) {
		t.Fatalf("indexes on the tasks = %v; want %v", names, wantNames)
	}
}

func slicesEqualFunc(a, b []keyIndex) bool {
	return slices.EqualFunc(a, b, func(x, y keyIndex) bool {
		return x.Name == y.Name && x.Usable == y.Usable && slices.Equal(x.Columns, y.Columns)
	})
}

func TestMigrateIsIdempotentAndSafeConcurrently(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		s, err := New(ctx, db.pool(t))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { errs[i] = s.Migrate(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	pool := db.pool(t)
	assertFinalSchema(t, pool)
	s, _ := New(ctx, pool)
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	assertFinalSchema(t, pool)
}

// migrationSteps returns the hook points of a full migration, in order.
func migrationSteps(t *testing.T) []string {
	t.Helper()
	db := newTestDB(t)
	var steps []string
	s := newStore(db.pool(t))
	s.test = &storeTestHooks{migrateStep: func(_ context.Context, step string, _ uint32) { steps = append(steps, step) }}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return steps
}

// terminate kills a backend and waits until it is gone.
func terminate(t testing.TB, pool *pgxpool.Pool, pid uint32) {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(context.Background(), "SELECT pg_terminate_backend($1, 10000)", int(pid)).Scan(&ok); err != nil || !ok {
		t.Errorf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
	}
}

func TestMigrateSurvivesBeingKilledAtEveryStep(t *testing.T) {
	t.Parallel()
	steps := migrationSteps(t)
	if len(steps) < 7 {
		t.Fatalf("only %d hook points: %v", len(steps), steps)
	}
	for i, step := range steps {
		t.Run(fmt.Sprintf("%d %s", i, step), func(t *testing.T) {
			t.Parallel()
			db := newTestDB(t)
			admin := db.pool(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			// Kill after the steps before this one have run.
			s := newStore(db.pool(t))
			s.test = &storeTestHooks{migrateStep: func(_ context.Context, got string, pid uint32) {
				if got == step {
					terminate(t, admin, pid)
				}
			}}
			if err := s.Migrate(ctx); err == nil {
				t.Fatal("Migrate succeeded on a killed connection")
			}
			assertKeyGuarded(t, admin)
			s.test = nil
			if err := s.Migrate(ctx); err != nil {
				t.Fatalf("rerun: %v", err)
			}
			assertFinalSchema(t, admin)
			assertKeyGuarded(t, admin)
		})
	}
}

// TestMigrateKilledMidBuildWhileSubmitting kills the migrating connection
// while CREATE INDEX CONCURRENTLY waits for a writer, with Submits running
// all along, then reruns the migration under the same load.
func TestMigrateKilledMidBuildWhileSubmitting(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	admin := db.pool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// Submitters start once v1 exists and run until the end.
	var (
		stop      = make(chan struct{})
		submitted atomic.Int64
		wg        sync.WaitGroup
		mu        sync.Mutex
		ids       = map[string]map[string]bool{} // key → IDs seen
		errs      []error
		startOnce sync.Once
	)
	startSubmitters := func() {
		for g := range 8 {
			s := newStore(db.pool(t))
			wg.Go(func() {
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					nt := newTask(fmt.Sprintf("key-%d", (n+g)%6))
					nt.Runtime = fmt.Sprintf("rt-%d", ((n+g)%6)%2) // v2 lets a key exist per runtime
					if ((n+g)%6)%2 == 1 {
						nt.IdempotencyKey += "-odd" // under v1, another runtime cannot share the key
					}
					got, err := s.Submit(ctx, nt)
					mu.Lock()
					if err != nil {
						errs = append(errs, err)
					} else {
						k := nt.IdempotencyKey + "/" + nt.Runtime
						if ids[k] == nil {
							ids[k] = map[string]bool{}
						}
						ids[k][got.ID] = true
					}
					mu.Unlock()
					submitted.Add(1)
				}
			})
		}
	}

	killed := make(chan struct{})
	var blocker pgx.Tx
	s := newStore(db.pool(t))
	// Every version but v2 (and v12, which comes after it) first: Submit
	// needs v3's columns.
	s.test = &storeTestHooks{migrateSkip: []int{2, 12}}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	s.test = &storeTestHooks{migrateStep: func(hctx context.Context, step string, pid uint32) {
		switch step {
		case "v2: drop an invalid leftover of the wide index":
			startOnce.Do(startSubmitters)
			wait.For(t, patience, "submits run", func() bool { return submitted.Load() > 50 })
		case "v2: build the wide index concurrently":
			// A writer that started before the build makes it wait
			// between its catalog entry and the table scan.
			var err error
			if blocker, err = admin.Begin(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := blocker.Exec(ctx, `INSERT INTO idemgate_tasks
				(tenant, owner, kind, runtime, network, idempotency_key, fingerprint)
				VALUES ('blocker', 'o', 'k', 'r', 'n', 'blocker', 'f')`); err != nil {
				t.Fatal(err)
			}
			go func() {
				defer close(killed)
				ok := wait.Until(patience, func() bool {
					var waiting bool
					err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_class WHERE relname = $1)
						AND EXISTS (SELECT FROM pg_stat_activity WHERE pid = $2 AND wait_event_type = 'Lock')`,
						indexKeyWide, int(pid)).Scan(&waiting)
					return err == nil && waiting
				})
				before := submitted.Load()
				ok = ok && wait.Until(patience, func() bool { return submitted.Load() > before+50 }) // submits run during the build
				if !ok {
					t.Error("the build never waited, or submits stalled during it")
				}
				terminate(t, admin, pid)
			}()
		}
	}}
	// The build waits for the blocker as long as it runs (no lock_timeout
	// on the CONCURRENTLY steps), so the kill always lands mid-build.
	err := s.Migrate(ctx)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		t.Fatal("Migrate succeeded although killed mid-build")
	case errors.As(err, &pgErr) && pgErr.Code == "55P03":
		t.Fatalf("the build gave up waiting instead of being killed: %v", err)
	}
	<-killed
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	idx := keyIndexes(t, admin)
	if !slices.ContainsFunc(idx, func(k keyIndex) bool { return k.Name == indexKeyWide && !k.Usable }) {
		t.Fatalf("no invalid leftover of the killed build: %+v", idx)
	}
	assertKeyGuarded(t, admin)

	before := submitted.Load()
	s.test = nil
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("rerun: %v", err)
	}
	wait.For(t, patience, "submits go on after the migration", func() bool { return submitted.Load() > before+200 })
	close(stop)
	wg.Wait()
	assertFinalSchema(t, admin)
	if len(errs) > 0 {
		t.Fatalf("%d submits failed, first: %v", len(errs), errs[0])
	}
	for k, seen := range ids {
		if len(seen) != 1 {
			t.Errorf("key %s got %d task IDs: %v", k, len(seen), seen)
		}
	}
	var dup int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM (SELECT FROM idemgate_tasks
		GROUP BY tenant, idempotency_key, runtime, network HAVING count(*) > 1) d`).Scan(&dup); err != nil {
		t.Fatal(err)
	}
	if dup != 0 {
		t.Fatalf("%d keys have more than one task", dup)
	}
}

// TestMigrateWaitsOutALongTransaction: CREATE INDEX CONCURRENTLY waits
// for every transaction older than the build. One running longer than
// the 5s lock_timeout of the transactional steps must delay v2, not
// fail it.
func TestMigrateWaitsOutALongTransaction(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	admin := db.pool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := newStore(db.pool(t))
	s.test = &storeTestHooks{migrateSkip: []int{2, 12}}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	long, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = long.Rollback(ctx) }() // if the test fails before its rollback
	if _, err := long.Exec(ctx, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint)
		VALUES ('long', 'o', 'k', 'r', 'n', 'long', 'f')`); err != nil {
		t.Fatal(err)
	}
	var pid atomic.Uint32
	s.test = &storeTestHooks{migrateStep: func(_ context.Context, step string, p uint32) {
		if step == "v2: build the wide index concurrently" {
			pid.Store(p)
		}
	}}
	done := make(chan error, 1)
	go func() { done <- s.Migrate(ctx) }()
	wait.For(t, patience, "Migrate waits on the long transaction's lock", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Migrate returned while the long transaction ran: %v", err)
		default:
		}
		var waitedLong bool
		err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1
			AND wait_event_type = 'Lock' AND now() - query_start > interval '6 seconds')`, int(pid.Load())).Scan(&waitedLong)
		return err == nil && waitedLong
	})
	if err := long.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Migrate after the long transaction ended: %v", err)
	}
	assertFinalSchema(t, admin)
}

// TestSubmitUnderTheNarrowIndex runs Submit on the v1 schema, as during a
// rolling upgrade: no index matches its conflict target, so it inserts
// plainly and reads a unique violation back by the full key.
func TestSubmitUnderTheNarrowIndex(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx := context.Background()
	s := newStore(db.pool(t))
	s.test = &storeTestHooks{migrateSkip: []int{2, 12}}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	first := mustSubmit(t, s, newTask("narrow"))
	again, err := s.Submit(ctx, newTask("narrow"))
	if err != nil || again.ID != first.ID || !again.Duplicate {
		t.Fatalf("resubmit = %s dup=%v, %v; want %s as a duplicate", again.ID, again.Duplicate, err, first.ID)
	}
	drifted := newTask("narrow")
	drifted.Fingerprint = "v1:other"
	if _, err := s.Submit(ctx, drifted); !errors.Is(err, ErrConflict) {
		t.Fatalf("drifted resubmit: %v; want ErrConflict", err)
	}
	// v1 cannot hold the key for a second runtime: a clear error, no task.
	other := newTask("narrow")
	other.Runtime = "cpu"
	if _, err := s.Submit(ctx, other); err == nil || errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "narrow") {
		t.Fatalf("other runtime under v1: %v; want an error naming the narrow index", err)
	}
	if n := countRows(t, s.pool, "idempotency_key = 'narrow'"); n != 1 {
		t.Fatalf("%d rows for the key; want 1", n)
	}
	s.test = nil
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := s.Submit(ctx, other)
	if err != nil || got.Duplicate || got.ID == first.ID {
		t.Fatalf("other runtime under v2 = %s dup=%v, %v; want a new task", got.ID, got.Duplicate, err)
	}
}

// TestBlockingLockWaiterDeadlocksTheBuild reproduces the trap Migrate
// avoids by polling: a session blocked in pg_advisory_lock holds a
// snapshot, CREATE INDEX CONCURRENTLY in the lock holder waits for that
// snapshot, and Postgres reports a deadlock.
func TestBlockingLockWaiterDeadlocksTheBuild(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := newStore(db.pool(t))
	s.test = &storeTestHooks{migrateSkip: []int{2, 12}}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	holder, err := pgx.Connect(ctx, db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	waiter, err := pgx.Connect(ctx, db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close(ctx)
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock(1)"); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := waiter.Exec(ctx, "SELECT pg_advisory_lock(1)")
		waited <- err
	}()
	wait.For(t, patience, "the waiter blocks on the advisory lock", func() bool {
		return countActivity(t, db.pool(t), "wait_event = 'advisory'") == 1
	})
	_, buildErr := holder.Exec(ctx, sqlCreateWideIndex)
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_unlock(1)"); err != nil {
		t.Fatal(err)
	}
	waitErr := <-waited
	var pgErr *pgconn.PgError
	if !errors.As(errors.Join(buildErr, waitErr), &pgErr) || pgErr.Code != "40P01" {
		t.Fatalf("build: %v, waiter: %v; want a deadlock (40P01)", buildErr, waitErr)
	}
}

func countActivity(t testing.TB, pool *pgxpool.Pool, where string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Schemas whose names need quoting (a keyword, mixed case, a quote, a
// dot, a space) migrate in place, twice, next to each other in one
// database, and a worker runs a task in each.
func TestMigrateOddSchemaNames(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	admin := db.pool(t)
	names := []string{"select", "MixedCase", `we"ird`, "a.b", "with space"}
	for _, name := range names {
		if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range names {
		cfg, err := pgxpool.ParseConfig(db.dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{name}.Sanitize() + ", public"
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		s := newStore(pool)
		for range 2 {
			if err := s.Migrate(ctx); err != nil {
				t.Fatalf("schema %q: %v", name, err)
			}
		}
		w := newWorker(t, s, WorkerConfig{Handler: func(ctx context.Context, t Task) Outcome {
			return Succeeded(json.RawMessage(`"ok"`))
		}})
		runWorker(t, w)
		task := mustSubmit(t, s, newTask("odd-"+name))
		waitState(t, s, task.ID, StateSucceeded)
	}
	var tables int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relname = 'idemgate_tasks' AND n.nspname = ANY($1)`, names).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != len(names) {
		t.Fatalf("%d task tables in the odd schemas; want %d", tables, len(names))
	}
	var stray bool
	if err := admin.QueryRow(ctx, `SELECT to_regclass('public.idemgate_tasks') IS NOT NULL`).Scan(&stray); err != nil {
		t.Fatal(err)
	}
	if stray {
		t.Fatal("a migration created the tasks table in public")
	}
}

// a migration rerun in schema a must not touch schema b, even
// when search_path reaches b.
func TestMigrateRerunStaysInItsSchema(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin := db.pool(t)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA a; CREATE SCHEMA b"); err != nil {
		t.Fatal(err)
	}
	inSchema := func(path string) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(db.dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["search_path"] = path
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	// b is at v1: its narrow index is its only uniqueness boundary.
	b := newStore(inSchema("b"))
	b.test = &storeTestHooks{migrateSkip: []int{2, 3, 4, 12}}
	if err := b.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// a migrates with b on its search_path and dies after dropping its
	// own narrow index, before recording v2.
	a := newStore(inSchema("a, b"))
	a.test = &storeTestHooks{migrateStep: func(_ context.Context, step string, pid uint32) {
		if step == "v2: record" {
			terminate(t, admin, pid)
		}
	}}
	if err := a.Migrate(ctx); err == nil {
		t.Fatal("Migrate succeeded on a killed connection")
	}
	a.test = nil
	if err := a.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var narrowInB bool
	if err := admin.QueryRow(ctx, `SELECT to_regclass('b.idemgate_tasks_key_v1') IS NOT NULL`).Scan(&narrowInB); err != nil {
		t.Fatal(err)
	}
	if !narrowInB {
		t.Fatal("the rerun in schema a dropped schema b's unique index")
	}
}
