package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/wait"
)

// plants are the operators and functions a role with CREATE on public
// plants there to run its code inside the queue's statements and
// functions: each records its name in public.planted_ran, then does what
// pg_catalog's would. Some have the exact argument types of a call that
// pg_catalog serves only through a cast or a polymorphic type (bigint *
// interval, text || smallint, array_agg(text)): the parser prefers them
// wherever they are visible. The others have pg_catalog's own signature:
// they win wherever a search path puts public before pg_catalog.
var plants = []struct{ name, sql string }{
	{"*(bigint, interval)", `CREATE FUNCTION public.planted_mul(bigint, interval) RETURNS interval LANGUAGE sql AS $$
		INSERT INTO public.planted_ran VALUES ('*(bigint, interval)');
		SELECT $1::float8 OPERATOR(pg_catalog.*) $2 $$;
		CREATE OPERATOR public.* (LEFTARG = bigint, RIGHTARG = interval, FUNCTION = public.planted_mul)`},
	{"||(text, smallint)", `CREATE FUNCTION public.planted_cat2(text, smallint) RETURNS text LANGUAGE sql AS $$
		INSERT INTO public.planted_ran VALUES ('||(text, smallint)');
		SELECT $1 OPERATOR(pg_catalog.||) $2::text $$;
		CREATE OPERATOR public.|| (LEFTARG = text, RIGHTARG = smallint, FUNCTION = public.planted_cat2)`},
	{"||(text, integer)", `CREATE FUNCTION public.planted_cat4(text, integer) RETURNS text LANGUAGE sql AS $$
		INSERT INTO public.planted_ran VALUES ('||(text, integer)');
		SELECT $1 OPERATOR(pg_catalog.||) $2::text $$;
		CREATE OPERATOR public.|| (LEFTARG = text, RIGHTARG = integer, FUNCTION = public.planted_cat4)`},
	{"*(double precision, numeric)", `CREATE FUNCTION public.planted_mulfn(float8, numeric) RETURNS float8 LANGUAGE sql AS $$
		INSERT INTO public.planted_ran VALUES ('*(double precision, numeric)');
		SELECT $1 OPERATOR(pg_catalog.*) $2::float8 $$;
		CREATE OPERATOR public.* (LEFTARG = float8, RIGHTARG = numeric, FUNCTION = public.planted_mulfn)`},
	{"+(double precision, numeric)", `CREATE FUNCTION public.planted_plusfn(float8, numeric) RETURNS float8 LANGUAGE sql AS $$
		INSERT INTO public.planted_ran VALUES ('+(double precision, numeric)');
		SELECT $1 OPERATOR(pg_catalog.+) $2::float8 $$;
		CREATE OPERATOR public.+ (LEFTARG = float8, RIGHTARG = numeric, FUNCTION = public.planted_plusfn)`},
	{"||(text, bigint)", `CREATE FUNCTION public.planted_cat8(text, bigint) RETURNS text LANGUAGE sql AS $$
		INSERT INTO public.planted_ran VALUES ('||(text, bigint)');
		SELECT $1 OPERATOR(pg_catalog.||) $2::text $$;
		CREATE OPERATOR public.|| (LEFTARG = text, RIGHTARG = bigint, FUNCTION = public.planted_cat8)`},
	{"cardinality(text[])", `CREATE FUNCTION public.cardinality(text[]) RETURNS integer LANGUAGE sql AS $$
		INSERT INTO public.planted_ran VALUES ('cardinality(text[])');
		SELECT pg_catalog.cardinality($1) $$`},
	{"power(integer, integer)", `CREATE FUNCTION public.power(integer, integer) RETURNS float8 LANGUAGE sql AS $$
		INSERT INTO public.planted_ran VALUES ('power(integer, integer)');
		SELECT pg_catalog.power($1::float8, $2::float8) $$`},
	{"floor(double precision)", `CREATE FUNCTION public.floor(float8) RETURNS float8 LANGUAGE sql AS $$
		INSERT INTO public.planted_ran VALUES ('floor(double precision)');
		SELECT pg_catalog.floor($1) $$`},
	{"=(text, text)", `CREATE FUNCTION public.planted_eq(text, text) RETURNS boolean LANGUAGE sql AS $$
		INSERT INTO public.planted_ran VALUES ('=(text, text)');
		SELECT $1 OPERATOR(pg_catalog.=) $2 $$;
		CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.planted_eq)`},
	{"-(timestamptz, interval)", `CREATE FUNCTION public.planted_minus(timestamptz, interval) RETURNS timestamptz LANGUAGE sql AS $$
		INSERT INTO public.planted_ran VALUES ('-(timestamptz, interval)');
		SELECT $1 OPERATOR(pg_catalog.-) $2 $$;
		CREATE OPERATOR public.- (LEFTARG = timestamptz, RIGHTARG = interval, FUNCTION = public.planted_minus)`},
	{"hashtext(text)", `CREATE FUNCTION public.hashtext(text) RETURNS integer LANGUAGE sql AS $$
		INSERT INTO public.planted_ran VALUES ('hashtext(text)');
		SELECT pg_catalog.hashtext($1) $$`},
	{"now()", `CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE sql AS $$
		INSERT INTO public.planted_ran VALUES ('now()');
		SELECT pg_catalog.now() $$`},
	{"pg_notify(text, text)", `CREATE FUNCTION public.pg_notify(text, text) RETURNS void LANGUAGE sql AS $$
		INSERT INTO public.planted_ran VALUES ('pg_notify(text, text)');
		SELECT pg_catalog.pg_notify($1, $2) $$`},
	{"current_setting(text)", `CREATE FUNCTION public.current_setting(text) RETURNS text LANGUAGE sql AS $$
		INSERT INTO public.planted_ran VALUES ('current_setting(text)');
		SELECT pg_catalog.current_setting($1) $$`},
	{"pg_advisory_xact_lock_shared(integer, integer)", `CREATE FUNCTION public.pg_advisory_xact_lock_shared(integer, integer)
		RETURNS void LANGUAGE sql AS $$
		INSERT INTO public.planted_ran VALUES ('pg_advisory_xact_lock_shared(integer, integer)');
		SELECT pg_catalog.pg_advisory_xact_lock_shared($1, $2) $$`},
	{"unnest(text[])", `CREATE FUNCTION public.unnest(text[]) RETURNS SETOF text LANGUAGE sql AS $$
		INSERT INTO public.planted_ran VALUES ('unnest(text[])');
		SELECT pg_catalog.unnest($1) $$`},
	{"array_agg(text)", `CREATE FUNCTION public.planted_append(text[], text) RETURNS text[] LANGUAGE sql AS $$
		INSERT INTO public.planted_ran VALUES ('array_agg(text)');
		SELECT pg_catalog.array_append($1, $2) $$;
		CREATE AGGREGATE public.array_agg(text) (SFUNC = public.planted_append, STYPE = text[])`},
}

// plantAll creates a role with CREATE on public and no right on the
// queue's tables, and plants every one of plants there as that role. It
// returns a reader of the names of the plants that ran.
func plantAll(t testing.TB, db testDB, s *Store) (ran func() []string) {
	t.Helper()
	ctx := hangBound(t)
	var dbname string
	if err := s.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&dbname); err != nil {
		t.Fatal(err)
	}
	role := "planter_" + strings.ReplaceAll(dbname, "-", "_")
	for _, q := range []string{
		`CREATE ROLE ` + pgx.Identifier{role}.Sanitize() + ` LOGIN NOSUPERUSER`,
		`GRANT CREATE, USAGE ON SCHEMA public TO ` + pgx.Identifier{role}.Sanitize(),
	} {
		if _, err := s.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = s.pool.Exec(ctx, `DROP OWNED BY `+pgx.Identifier{role}.Sanitize())
		_, _ = s.pool.Exec(ctx, `DROP ROLE `+pgx.Identifier{role}.Sanitize())
	})
	cfg, err := pgx.ParseConfig(db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Password = role, ""
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var super bool
	if err := conn.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super); err != nil || super {
		t.Fatalf("the planting role is a superuser (%v) or cannot say (%v)", super, err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE public.planted_ran (name text);
		GRANT INSERT, SELECT ON public.planted_ran TO PUBLIC`); err != nil {
		t.Fatal(err)
	}
	for _, p := range plants {
		if _, err := conn.Exec(ctx, p.sql); err != nil {
			t.Fatalf("plant %s: %v", p.name, err)
		}
	}
	// Every plant is in place and runs where a call finds it.
	if _, err := conn.Exec(ctx, `SELECT 1::bigint * interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	return func() []string {
		t.Helper()
		rows, _ := s.pool.Query(context.Background(), `SELECT DISTINCT name FROM public.planted_ran ORDER BY 1`)
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
}

// Nothing planted in public by a role with CREATE there runs inside the
// schema's functions or the store's statements: Submit (its trigger and
// notification), SubmitMany, SubmitTx, limited and free claims, every
// ending of an attempt (succeeded, failed, retried, uncertain and
// reconciled, released at shutdown, rescued after its lease), heartbeats,
// Cancel, Recover, the operator's Retry, List and Get, Stats, Prune, kind
// limits, the sweep, and Migrate run again. A plant that ran would run
// with the rights of the role running the queue.
func TestPlantedOperatorsAndFunctionsNeverRun(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	ran := plantAll(t, db, s)
	if got := ran(); len(got) != 1 || got[0] != "*(bigint, interval)" {
		t.Fatalf("the plants' self-check recorded %v; want [*(bigint, interval)]", got)
	}
	if _, err := s.pool.Exec(context.Background(), `TRUNCATE public.planted_ran`); err != nil {
		t.Fatal(err)
	}
	exerciseStore(t, s)
	if got := ran(); len(got) != 0 {
		t.Fatalf("planted code ran inside the queue: %v", got)
	}
}

// exerciseStore runs every statement of the store once at least.
func exerciseStore(t *testing.T, s *Store) {
	t.Helper()
	ctx := hangBound(t)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunning: 8, MaxRunningPerTenant: 4, StartsPerSecond: 1000}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateKindLimits(ctx, "image", func(l KindLimits) KindLimits { l.MaxRunning = 9; return l }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.KindLimits(ctx, "image"); err != nil {
		t.Fatal(err)
	}
	task := func(tenant, key, kind string) NewTask {
		nt := tenantTask(tenant, key)
		nt.Kind = kind
		return nt
	}
	var ids []string
	for _, nt := range []NewTask{task("a", "succeed", "image"), task("b", "fail", "image"), task("c", "retry", "image"),
		task("a", "uncertain", "image"), task("d", "succeed-free", "audio"), task("e", "fail-partial", "audio")} {
		got := mustSubmit(t, s, nt)
		ids = append(ids, got.ID)
	}
	mustSubmit(t, s, task("a", "succeed", "image")) // a duplicate
	later := task("f", "later", "audio")
	later.RunAfter = time.Now().Add(300 * time.Millisecond)
	mustSubmit(t, s, later)
	if _, err := s.SubmitMany(ctx, []NewTask{task("g", "many-1", "audio"), task("h", "many-2", "audio"),
		task("a", "succeed", "image")}); err != nil {
		t.Fatal(err)
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		_, err := s.SubmitTx(ctx, tx, task("i", "tx", "audio"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	cancelled := mustSubmit(t, s, task("j", "cancel-me", "video"))
	if _, err := s.Cancel(ctx, "j", "owner-a", cancelled.ID); err != nil {
		t.Fatal(err)
	}

	var reconciled, slowStarted atomic.Bool
	release := make(chan struct{})
	handler := func(ctx context.Context, tk Task) Outcome {
		switch tk.IdempotencyKey {
		case "fail":
			return Failed(errors.New("no"))
		case "fail-partial":
			return Failed(errors.New("part"), json.RawMessage(`{"part":1}`))
		case "retry":
			if tk.Attempt < 2 {
				return Retry(time.Millisecond, errors.New("again"))
			}
		case "uncertain":
			return Uncertain(errors.New("unknown"))
		case "slow":
			slowStarted.Store(true)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return Outcome{}
		}
		return Succeeded(json.RawMessage(`1`))
	}
	w := newWorker(t, s, WorkerConfig{Handler: handler, Lease: 2 * time.Second, Heartbeat: 100 * time.Millisecond,
		RescueInterval: 100 * time.Millisecond, ReconcileInterval: 50 * time.Millisecond, MaxAttempts: 3,
		BackoffBase: time.Millisecond, BackoffMax: time.Millisecond, ShutdownTimeout: 200 * time.Millisecond,
		Reconcile: func(context.Context, Task) Outcome { reconciled.Store(true); return Succeeded() },
		Policies:  map[string]KindPolicy{"image": {Lost: LostUncertain}}})
	stop := runWorker(t, w)
	wait.For(t, patience, "every task ended", func() bool {
		return countRows(t, s.pool, "state IN ('pending', 'retrying', 'running', 'uncertain')") == 0
	})
	if !reconciled.Load() {
		t.Fatal("no Reconcile ran")
	}
	// An attempt held past a few heartbeats, then released at shutdown.
	mustSubmit(t, s, task("k", "slow", "image"))
	wait.For(t, patience, "the slow attempt started", slowStarted.Load)
	time.Sleep(300 * time.Millisecond) // heartbeats
	stop()
	close(release)
	// A lease that ran out, rescued by another worker.
	lapsed := mustSubmit(t, s, task("l", "lapsed", "audio"))
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'running', attempt = 1, tries = 1,
		lease_until = now() - interval '1 second', locked_by = 'dead' WHERE id = $1::uuid`, lapsed.ID); err != nil {
		t.Fatal(err)
	}
	stop2 := runWorker(t, newWorker(t, s, WorkerConfig{Handler: handler, RescueInterval: 50 * time.Millisecond,
		BackoffBase: time.Millisecond, BackoffMax: time.Millisecond, Kinds: []string{"audio"}}))
	wait.For(t, patience, "the lapsed task was rescued and ran", func() bool {
		return countRows(t, s.pool, "id = $1::uuid AND state = 'succeeded'", lapsed.ID) == 1
	})
	stop2()

	failed, err := s.Operator().List(ctx, Filter{State: StateFailed, Limit: 10})
	if err != nil || len(failed) == 0 {
		t.Fatalf("List of failed tasks: %d, %v", len(failed), err)
	}
	for _, f := range failed {
		if f.IdempotencyKey == "fail-partial" {
			if _, err := s.Recover(ctx, f.Tenant, f.Owner, f.ID); err != nil {
				t.Fatalf("Recover: %v", err)
			}
		} else if _, err := s.Operator().Retry(ctx, f.ID); err != nil {
			t.Fatalf("Retry: %v", err)
		}
	}
	if _, err := s.Operator().Get(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Operator().Cancel(ctx, failed[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stats(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prune(ctx, 0); err != nil {
		t.Fatal(err)
	}
	r := &rescuer{pool: s.pool}
	for first := true; first || r.after != (waitingLine{}); first = false {
		if _, err := r.sweepWaiting(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.MigrationStatus(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
}

// The schema's functions read and write the schema's tables, never a
// session's temporary tables of the same names (their search_path puts
// pg_temp last), and call no function or operator of pg_temp: a session whose own temporary idemgate_tasks is empty
// and whose temporary idemgate_waiting_tenants takes any row still lists
// its tasks' lines in the schema's table, and its sweep keeps them. With
// pg_temp searched first, the trigger listed the line in the temporary
// table and the sweep, reading the empty temporary tasks, removed the
// schema's lines of waiting tasks.
func TestSchemaFunctionsIgnoreTemporaryTables(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := hangBound(t)
	mustSubmit(t, s, tenantTask("waits", "k1"))
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	defer conn.Conn().Close(context.Background()) //nolint:errcheck // its temporary tables go with it
	if _, err := conn.Exec(ctx, `CREATE TEMP TABLE idemgate_tasks (LIKE public.idemgate_tasks);
		CREATE TEMP TABLE idemgate_waiting_tenants (LIKE public.idemgate_waiting_tenants INCLUDING ALL)`); err != nil {
		t.Fatal(err)
	}
	// Functions and operators in pg_temp fail whatever calls them.
	if _, err := conn.Exec(ctx, `CREATE FUNCTION pg_temp.hashtext(text) RETURNS integer LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'planted pg_temp.hashtext ran'; END $$;
		CREATE FUNCTION pg_temp.planted_cat2(text, smallint) RETURNS text LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'planted pg_temp.||(text, smallint) ran'; END $$;
		CREATE OPERATOR pg_temp.|| (LEFTARG = text, RIGHTARG = smallint, FUNCTION = pg_temp.planted_cat2)`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO public.idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, turn)
		VALUES ('temp-session', 'o', 'image', 'r', 'n', 'k2', 'f', 0)`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `UPDATE public.idemgate_waiting_tenants SET listed_at = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT * FROM public.idemgate_sweep_waiting('', 0::smallint, '', 100, 0)`); err != nil {
		t.Fatal(err)
	}
	var inTemp int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_temp.idemgate_waiting_tenants`).Scan(&inTemp); err != nil {
		t.Fatal(err)
	}
	if got, want := waitingLines(t, s), []string{"image/0/temp-session", "image/0/waits"}; !slices.Equal(got, want) || inTemp != 0 {
		t.Fatalf("the schema's waiting lines %v (want %v); %d in the session's temporary table (want 0)", got, want, inTemp)
	}
}

// v11 revokes EXECUTE on the schema's functions from PUBLIC and grants it
// to the roles that may write the tasks table when it runs: such a role
// submits, cancels and sweeps as before; a role without it cannot call
// the functions; and the trigger fires for any writer.
func TestFunctionGrantsFollowTheTableGrants(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx := hangBound(t)
	owner := newStore(db.pool(t))
	owner.test = &storeTestHooks{migrateSkip: []int{11}}
	if err := owner.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var dbname string
	if err := owner.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&dbname); err != nil {
		t.Fatal(err)
	}
	app := pgx.Identifier{"app_" + strings.ReplaceAll(dbname, "-", "_")}.Sanitize()
	reader := pgx.Identifier{"reader_" + strings.ReplaceAll(dbname, "-", "_")}.Sanitize()
	for _, q := range []string{
		`CREATE ROLE ` + app + ` LOGIN NOSUPERUSER`,
		`CREATE ROLE ` + reader + ` LOGIN NOSUPERUSER`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON idemgate_tasks, idemgate_waiting_tenants, idemgate_kind_limits TO ` + app,
		`GRANT SELECT ON idemgate_tasks TO ` + reader,
	} {
		if _, err := owner.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, r := range []string{app, reader} {
			_, _ = owner.pool.Exec(context.Background(), `DROP OWNED BY `+r)
			_, _ = owner.pool.Exec(context.Background(), `DROP ROLE `+r)
		}
	})
	owner.test = nil
	if err := owner.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		role string
		want bool
	}{{"PUBLIC", false}, {app, true}, {reader, false}} {
		for _, f := range []string{"idemgate_tasks_notify(text)", "idemgate_tasks_notify_cancel(text)",
			"idemgate_sweep_waiting(text, smallint, text, integer, bigint)"} {
			var got bool
			q := `SELECT has_function_privilege($1, $2, 'EXECUTE')`
			args := []any{strings.Trim(c.role, `"`), f}
			if c.role == "PUBLIC" {
				q = `SELECT EXISTS (SELECT FROM pg_proc p CROSS JOIN LATERAL aclexplode(p.proacl) a
					WHERE p.oid = $1::regprocedure AND a.grantee = 0)`
				args = args[1:]
			}
			if err := owner.pool.QueryRow(ctx, q, args...).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("%s may execute %s: %v; want %v", c.role, f, got, c.want)
			}
		}
	}
	cfg, err := pgxpool.ParseConfig(db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = strings.Trim(app, `"`), ""
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := newStore(pool)
	got := mustSubmit(t, s, tenantTask("app", "k1"))
	if _, err := s.Cancel(ctx, got.Tenant, got.Owner, got.ID); err != nil {
		t.Fatal(err)
	}
	mustSubmit(t, s, tenantTask("app", "k2"))
	sweepAll(t, s)
	if got := waitingLines(t, owner); !slices.Equal(got, []string{"image/0/app"}) {
		t.Fatalf("waiting lines after the app role's Submits and sweep: %v", got)
	}
}
