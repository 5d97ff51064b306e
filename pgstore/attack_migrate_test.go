package pgstore

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Schemas whose names need quoting (a keyword, mixed case, a quote, a
// dot, a space) migrate in place, twice, next to each other in one
// database, and a worker runs a task in each.
func TestAttackMigrateOddSchemaNames(t *testing.T) {
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
