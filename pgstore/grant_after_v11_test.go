package pgstore

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A role given the queue's tables after v11 ran has no EXECUTE on the
// schema's functions: its Submit fails with an error that names the
// function (not a generic store failure); after the one GRANT that
// docs/tasks.md gives, it submits, cancels and sweeps.
func TestARoleGrantedTheTablesAfterV11NeedsTheDocumentedGrant(t *testing.T) {
	t.Parallel()
	owner, db := setup(t)
	ctx := hangBound(t)
	var dbname string
	if err := owner.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&dbname); err != nil {
		t.Fatal(err)
	}
	role := "late_" + strings.ReplaceAll(dbname, "-", "_")
	app := pgx.Identifier{role}.Sanitize()
	for _, q := range []string{
		`CREATE ROLE ` + app + ` LOGIN NOSUPERUSER`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON idemgate_tasks, idemgate_waiting_tenants, idemgate_kind_limits TO ` + app,
	} {
		if _, err := owner.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = owner.pool.Exec(context.Background(), `DROP OWNED BY `+app)
		_, _ = owner.pool.Exec(context.Background(), `DROP ROLE `+app)
	})
	cfg, err := pgxpool.ParseConfig(db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, ""
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := newStore(pool)

	_, err = s.Submit(ctx, tenantTask("late", "k1"))
	if err == nil || !strings.Contains(err.Error(), "permission denied for function idemgate_tasks_notify") ||
		!strings.HasPrefix(err.Error(), "pgstore: submit") {
		t.Fatalf("Submit of a role without EXECUTE: %v; want pgstore: submit: … permission denied for function idemgate_tasks_notify", err)
	}

	// docs/tasks.md, "Roles".
	if _, err := owner.pool.Exec(ctx, `GRANT EXECUTE ON FUNCTION idemgate_tasks_notify(text),
		idemgate_tasks_notify_cancel(text), idemgate_sweep_waiting(text,
		smallint, text, integer, bigint) TO `+app); err != nil {
		t.Fatal(err)
	}
	got := mustSubmit(t, s, tenantTask("late", "k1"))
	if _, err := s.Cancel(ctx, got.Tenant, got.Owner, got.ID); err != nil {
		t.Fatal(err)
	}
	mustSubmit(t, s, tenantTask("late", "k2"))
	if _, err := s.SubmitMany(ctx, []NewTask{tenantTask("late", "k3")}); err != nil {
		t.Fatal(err)
	}
	sweepAll(t, s)
	if got := waitingLines(t, owner); !slices.Equal(got, []string{"image/0/late"}) {
		t.Fatalf("waiting lines after the late role's Submits and sweep: %v", got)
	}
}

// v11 grants EXECUTE to the tasks table's owner when it is not the
// functions' owner (a DBA migrated as one role, then gave the tables to
// the application's role, which holds no explicit grant: its rights are
// the owner's, absent from the table's ACL until someone grants): that
// role submits, cancels and sweeps as before v11. v11 read only the
// explicit grants, and the owner's Submit failed with "permission denied
// for function idemgate_tasks_notify".
func TestV11GrantsTheFunctionsToTheTablesOwner(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx := hangBound(t)
	migrator := newStore(db.pool(t))
	migrator.test = &storeTestHooks{migrateSkip: []int{11}}
	if err := migrator.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var dbname string
	if err := migrator.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&dbname); err != nil {
		t.Fatal(err)
	}
	role := "tables_owner_" + strings.ReplaceAll(dbname, "-", "_")
	app := pgx.Identifier{role}.Sanitize()
	for _, q := range []string{
		`CREATE ROLE ` + app + ` LOGIN NOSUPERUSER`,
		`ALTER TABLE idemgate_tasks OWNER TO ` + app,
		`ALTER TABLE idemgate_waiting_tenants OWNER TO ` + app,
		`ALTER TABLE idemgate_kind_limits OWNER TO ` + app,
	} {
		if _, err := migrator.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = migrator.pool.Exec(context.Background(), `REASSIGN OWNED BY `+app+` TO CURRENT_USER`)
		_, _ = migrator.pool.Exec(context.Background(), `DROP OWNED BY `+app)
		_, _ = migrator.pool.Exec(context.Background(), `DROP ROLE `+app)
	})
	migrator.test = nil
	if err := migrator.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, ""
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := newStore(pool)
	got, err := s.Submit(ctx, tenantTask("owner", "k1"))
	if err != nil {
		t.Fatalf("Submit of the tables' owner after v11: %v", err)
	}
	if _, err := s.Cancel(ctx, got.Tenant, got.Owner, got.ID); err != nil {
		t.Fatal(err)
	}
	mustSubmit(t, s, tenantTask("owner", "k2"))
	sweepAll(t, s)
	if got := waitingLines(t, migrator); !slices.Equal(got, []string{"image/0/owner"}) {
		t.Fatalf("waiting lines after the owner's Submits and sweep: %v", got)
	}
}
