package pgstore

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/internal/migrate/migratetest"
)

// describe is what db's schema holds, with pgstore's recorded versions.
func (d testDB) describe(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	s, err := migratetest.Describe(ctx, conn, "idemgate_schema_migrations")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestMigrationSQL applies MigrationSQL to empty databases as psql does
// and as a tool that runs its chunks does: each schema equals Migrate's,
// versions included, and Migrate then finds no version to apply.
func TestMigrationSQL(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	script := MigrationSQL()
	for _, m := range migrations {
		if !strings.Contains(script, fmt.Sprintf("-- idemgate:begin pgstore v%d ", m.Version)) {
			t.Fatalf("the script lacks v%d", m.Version)
		}
	}
	built := newTestDB(t)
	built.store(t)
	want := built.describe(t)
	if !strings.Contains(want, "version idemgate_schema_migrations:1 ") {
		t.Fatalf("describe shows no versions:\n%s", want)
	}

	apply := map[string]func(t *testing.T, db testDB){
		"psql": func(t *testing.T, db testDB) {
			psql, err := exec.LookPath("psql")
			if err != nil {
				t.Skip("no psql")
			}
			f := filepath.Join(t.TempDir(), "pgstore.sql")
			if err := os.WriteFile(f, []byte(script), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := exec.CommandContext(ctx, psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", f, db.dsn).CombinedOutput()
			if err != nil {
				t.Fatalf("psql: %v\n%s", err, out)
			}
		},
		"chunks": func(t *testing.T, db testDB) {
			conn, err := pgx.Connect(ctx, db.dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			if err := migratetest.Apply(ctx, conn, script); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, apply := range apply {
		t.Run(name, func(t *testing.T) {
			db := newTestDB(t)
			apply(t, db)
			if got := db.describe(t); got != want {
				t.Fatalf("schema from the script differs from Migrate's:\n--- script\n%s\n--- Migrate\n%s", got, want)
			}
			s := newStore(db.pool(t))
			var steps []string
			s.test = &storeTestHooks{migrateStep: func(_ context.Context, step string, _ uint32) { steps = append(steps, step) }}
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(steps, []string{"locked", "done"}) {
				t.Fatalf("Migrate after the script ran %v, want nothing", steps)
			}
			vs, err := s.MigrationStatus(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(vs) != len(migrations) {
				t.Fatalf("status: %+v", vs)
			}
			for _, v := range vs {
				if !v.Applied || v.Unknown {
					t.Fatalf("status after the script: %+v", v)
				}
			}
			// The script again: its first version refuses, loudly.
			conn, err := pgx.Connect(ctx, db.dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			if err := migratetest.Apply(ctx, conn, script); err == nil || !strings.Contains(err.Error(), "pgstore v1 is applied already") {
				t.Fatalf("the script run twice: %v", err)
			}
		})
	}
}

// TestMigrationStatusOnlyReads: the status of a database never migrated
// has no version applied and creates nothing.
func TestMigrationStatusOnlyReads(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	s := newStore(db.pool(t))
	vs, err := s.MigrationStatus(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		if v.Applied {
			t.Fatalf("applied on an empty database: %+v", v)
		}
	}
	if got := db.describe(t); got != "" {
		t.Fatalf("status created:\n%s", got)
	}
}
