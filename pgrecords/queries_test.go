package pgrecords_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/internal/wait"
	"github.com/idemgate/idemgate/pgrecords"
)

// planted are the objects a role with CREATE on public plants to shadow
// what the store's SQL calls: an operator or function of the same name
// that is an exact match where pg_catalog's needs a cast (bigint *
// interval, quote_ident(name)), or the same signature, which wins on a
// search_path that lists public before pg_catalog. Each raises, naming
// itself and the role it ran as: a statement that calls one fails.
var planted = []struct{ name, args, returns string }{
	{"*", "bigint, interval", "interval"},
	{"*", "integer, interval", "interval"},
	{"*", "numeric, numeric", "numeric"},
	{"-", "numeric, numeric", "numeric"},
	{"+", "timestamptz, interval", "timestamptz"},
	{"=", "text, text", "boolean"},
	{"=", "uuid, uuid", "boolean"},
	{"=", "bytea, bytea", "boolean"},
	{"=", "tid, tid", "boolean"},
	{"=", "boolean, boolean", "boolean"},
	{"<=", "timestamptz, timestamptz", "boolean"},
	{">", "timestamptz, timestamptz", "boolean"},
	{"now", "", "timestamptz"},
	{"clock_timestamp", "", "timestamptz"},
	{"current_setting", "text, boolean", "text"},
	{"current_setting", "name, boolean", "text"},
	{"current_schema", "", "name"},
	{"format", "text, name", "text"},
	{"quote_ident", "name", "text"},
	{"hashtext", "name", "integer"},
	{"octet_length", "bytea", "integer"},
	{"set_config", "text, text, boolean", "text"},
}

// plant creates the planted objects in schema (public, or pg_temp of
// conn's session) as conn's role.
func plant(ctx context.Context, conn *pgx.Conn, schema string) error {
	for i, p := range planted {
		var params []string
		for j, a := range strings.Split(p.args, ", ") {
			if a != "" {
				params = append(params, fmt.Sprintf("a%d %s", j, a))
			}
		}
		fn := p.name
		if !isIdent(p.name) {
			fn = fmt.Sprintf("planted_op_%d", i)
		}
		sql := fmt.Sprintf(`CREATE FUNCTION %s.%s(%s) RETURNS %s LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'planted %s(%s) in %s ran as %%', current_user USING ERRCODE = 'XX666';
END
$$`, schema, pgx.Identifier{fn}.Sanitize(), strings.Join(params, ", "), p.returns, p.name, p.args, schema)
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("plant %s(%s): %w", p.name, p.args, err)
		}
		if fn != p.name {
			l, r, _ := strings.Cut(p.args, ", ")
			op := fmt.Sprintf(`CREATE OPERATOR %s.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = %s.%s)`, schema, p.name, l, r, schema, fn)
			if _, err := conn.Exec(ctx, op); err != nil {
				return fmt.Errorf("plant operator %s(%s): %w", p.name, p.args, err)
			}
		}
	}
	// A table of the records' name: found first in a search_path that
	// puts pg_temp first or leaves it out.
	if schema == "pg_temp" {
		if _, err := conn.Exec(ctx, `CREATE TEMP TABLE idemgate_records (key text, token uuid, finished boolean, expires_at timestamptz, ident bytea, sums bytea, response bytea)`); err != nil {
			return err
		}
	}
	return nil
}

func isIdent(s string) bool {
	return strings.IndexFunc(s, func(r rune) bool { return r != '_' && (r < 'a' || r > 'z') }) < 0
}

// planterConn connects to the database of dsn as a new role that has
// CREATE on public and no right on the records (as every role has on
// PostgreSQL 14 and older, and in databases upgraded from them).
func planterConn(t *testing.T, admin *pgxpool.Pool, dsn string) *pgx.Conn {
	t.Helper()
	ctx := testCtx(t)
	var role string
	if err := admin.QueryRow(ctx, `SELECT current_database() || '_planter'`).Scan(&role); err != nil {
		t.Fatal(err)
	}
	id := pgx.Identifier{role}.Sanitize()
	if _, err := admin.Exec(ctx, `CREATE ROLE `+id+` LOGIN PASSWORD 'planter'; GRANT CREATE ON SCHEMA public TO `+id); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Password = role, "planter"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = conn.Close(ctx)
		if _, err := admin.Exec(ctx, `DROP OWNED BY `+id+`; DROP ROLE `+id); err != nil {
			t.Errorf("drop role: %v", err)
		}
	})
	return conn
}

// TestPlantedObjectsNeverRun: a role with CREATE on public and no right
// on the records plants operators and functions that shadow what the
// store's SQL calls, in public and in its own pg_temp. Then the newest
// schema version is applied, and every statement of the store runs (the
// claim of a new key, a replay, a reclaim, extend, complete and a resent
// one, release, sweep, inspect and forget, an Atomic completion with and
// without a key, a rollback, the migration status and a migration run),
// by a superuser, on a pool with the default search_path and on one that
// lists public before pg_catalog: nothing planted runs. The planter
// cannot call the store's functions at all, so in its own session, with
// the mark set, its pg_temp objects do not run either.
func TestPlantedObjectsNeverRun(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	admin := newPool(t, dsn)
	ctx := testCtx(t)
	if err := pgrecords.MigrateSkipping(ctx, admin, 4); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, ledgerDDL); err != nil {
		t.Fatal(err)
	}
	planter := planterConn(t, admin, dsn)
	if err := plant(ctx, planter, "public"); err != nil {
		t.Fatal(err)
	}
	// The newest version applied, as the superuser, over what was planted.
	if err := pgrecords.MigrateSkipping(ctx, admin); err != nil {
		t.Fatalf("migrate over planted objects: %v", err)
	}

	t.Run("planter's own session", func(t *testing.T) {
		if err := plant(ctx, planter, "pg_temp"); err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{
			`SELECT public.idemgate_records_claim('planted', gen_random_uuid(), '\x00', NULL, 1000000)`,
			`SELECT public.idemgate_records_commit_tx('planted', gen_random_uuid(), 1000000, '\x00')`,
			`SELECT public.idemgate_records_commit_tx(NULL, NULL, NULL, NULL)`,
			`SELECT public.idemgate_records_complete_tx('planted', gen_random_uuid(), 1000000, '\x00')`,
		} {
			tx, err := planter.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_, err = tx.Exec(ctx, `SET LOCAL idemgate.tx = 'pgrecords'; `+q)
			_ = tx.Rollback(ctx)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "42501" || !strings.Contains(pgErr.Message, "function") {
				t.Errorf("%s as the planter: %v, want permission denied for the function (42501)", q, err)
			}
		}
	})

	for _, tt := range []struct {
		name string
		path string // the pool's search_path; "" the server's default
	}{
		{name: "default search_path"},
		{name: "public before pg_catalog", path: "public, pg_catalog"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pool := poolWith(t, dsn, func(c *pgxpool.Config) {
				if tt.path != "" {
					c.ConnConfig.RuntimeParams["search_path"] = tt.path
				}
			})
			s, err := pgrecords.New(ctx, pool)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			exerciseStore(t, ctx, s)
			if _, err := s.MigrationStatus(ctx); err != nil {
				t.Errorf("MigrationStatus: %v", err)
			}
			if err := s.Migrate(ctx); err != nil {
				t.Errorf("Migrate: %v", err)
			}
			exerciseAtomic(t, s, admin, tt.name)
		})
	}
}

// exerciseStore runs every statement of the store's idemgate.Store and
// Inspector side, failing the test on any error or wrong outcome.
func exerciseStore(t *testing.T, ctx context.Context, s *pgrecords.Store) {
	t.Helper()
	req := func(lease time.Duration) idemgate.ClaimRequest {
		return idemgate.ClaimRequest{Owner: "acme", Kind: "POST /", Fingerprint: "f", Token: randomToken(t), Lease: lease}
	}
	check := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	key := "planted-" + strings.ReplaceAll(t.Name(), "/", "-")
	first := req(time.Minute)
	res, err := s.Claim(ctx, key, first)
	check("claim", err)
	if res.Status != idemgate.Claimed {
		t.Fatalf("claim = %v, want claimed", res.Status)
	}
	check("extend", s.Extend(ctx, key, first.Token, time.Minute))
	resp := idemgate.Response{Status: 201, Body: []byte("charged")}
	check("complete", s.Complete(ctx, key, first.Token, resp, time.Hour))
	check("resent complete", s.Complete(ctx, key, first.Token, resp, time.Hour))
	res, err = s.Claim(ctx, key, req(time.Minute))
	check("replay", err)
	if res.Status != idemgate.Finished || string(res.Response.Body) != "charged" {
		t.Fatalf("replay = %v %q, want the stored answer", res.Status, res.Response.Body)
	}
	info, err := s.Inspect(ctx, key)
	check("inspect", err)
	check("forget", s.Forget(ctx, key, info.Token, info.Finished))

	held := req(time.Minute)
	_, err = s.Claim(ctx, key+"-release", held)
	check("claim to release", err)
	check("release", s.Release(ctx, key+"-release", held.Token))

	_, err = s.Claim(ctx, key+"-expired", req(time.Millisecond))
	check("claim to expire", err)
	time.Sleep(5 * time.Millisecond)
	res, err = s.Claim(ctx, key+"-expired", req(time.Minute))
	check("reclaim", err)
	if res.Status != idemgate.Claimed {
		t.Fatalf("reclaim = %v, want claimed", res.Status)
	}
	_, err = s.Claim(ctx, key+"-swept", req(time.Millisecond))
	check("claim to sweep", err)
	wait.Until(10*time.Second, func() bool {
		n, err := s.Sweep(ctx)
		check("sweep", err)
		return n > 0
	})
}

// exerciseAtomic runs an Atomic route on s: a completion with a key and
// one without, and a rollback.
func exerciseAtomic(t *testing.T, s *pgrecords.Store, admin *pgxpool.Pool, name string) {
	t.Helper()
	e := atomicRoute(t, s, func(c echo.Context) error {
		if err := ledgerInsert(c.Request().Context(), pgrecords.Tx(c), c.Request().Header.Get("Idempotency-Key"), "h"); err != nil {
			return err
		}
		if c.Request().Header.Get("X-Mode") == "fail" {
			return echo.NewHTTPError(http.StatusConflict, "refused")
		}
		return c.String(http.StatusCreated, "charged")
	}, nil)
	key := "atomic-" + strings.ReplaceAll(name, " ", "-")
	if rec := atomicSendMode(e, key, ""); rec.Code != http.StatusCreated {
		t.Errorf("atomic = %d %q, want 201", rec.Code, rec.Body)
	}
	if rec := atomicSendMode(e, key, ""); rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("atomic retry = %d %q, want the stored answer", rec.Code, rec.Body)
	}
	if rec := atomicSendMode(e, "", ""); rec.Code != http.StatusCreated {
		t.Errorf("atomic without a key = %d %q, want 201", rec.Code, rec.Body)
	}
	if rec := atomicSendMode(e, key+"-fail", "fail"); rec.Code != http.StatusConflict {
		t.Errorf("atomic that fails = %d %q, want 409", rec.Code, rec.Body)
	}
	if got := ledgerRows(t, admin, key); got != 1 {
		t.Errorf("ledger rows = %d, want 1", got)
	}
}

func randomToken(t *testing.T) idemgate.Token {
	var tok idemgate.Token
	if _, err := rand.Read(tok[:]); err != nil {
		t.Fatal(err)
	}
	return tok
}
