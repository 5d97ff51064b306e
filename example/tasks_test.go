package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/pgstore"
)

// The example's tasks commands are the idemgate command's (internal/cli
// tests them); these check the wiring: exit codes, output and the
// environment reach the shared code.
func TestTasksRunsTheSharedCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.PostgresDSN(t)
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return dsn
		}
		return ""
	}
	tasks := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := run(ctx, append([]string{"tasks"}, args...), getenv, &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	// Never migrates: an empty database is refused, and stays empty.
	if code, _, errOut := tasks("list"); code != 1 || !strings.Contains(errOut, "no pgstore tables") {
		t.Fatalf("tasks list on an empty database: exit %d, %q", code, errOut)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := pgstore.New(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	task, err := store.Submit(ctx, pgstore.NewTask{Tenant: "acme", Owner: "owner", Kind: kindImages,
		Runtime: taskRuntime, Network: taskNetwork, IdempotencyKey: "k", Fingerprint: "v1:fp", Params: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := tasks("-json", "show", task.ID); code != 0 || !strings.Contains(out, task.ID) || !json.Valid([]byte(out)) {
		t.Fatalf("tasks -json show: exit %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := tasks("pause", "imgaes"); code != 1 || !strings.Contains(errOut, "-new-kind") {
		t.Fatalf("tasks pause of a typo: exit %d, %q", code, errOut)
	}
	if code, _, errOut := tasks("purge"); code != 2 || !strings.Contains(errOut, "go run ./example tasks") {
		t.Fatalf("tasks purge: exit %d, %q", code, errOut)
	}
}

// opsBench is a migrated database with tasks of two tenants (the queue
// route's tests use it).
type opsBench struct {
	dsn   string
	pool  *pgxpool.Pool
	store *pgstore.Store
	ids   []string // acme's images task, acme's music task, globex's images task
}

func newOpsBench(t *testing.T) *opsBench {
	t.Helper()
	ctx := context.Background()
	dsn := testenv.PostgresDSN(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := pgstore.New(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	o := &opsBench{dsn: dsn, pool: pool, store: store}
	for i, nt := range []struct{ tenant, kind string }{{"acme", kindImages}, {"acme", kindMusic}, {"globex", kindImages}} {
		task, err := store.Submit(ctx, pgstore.NewTask{Tenant: nt.tenant, Owner: "owner", Kind: nt.kind,
			Runtime: taskRuntime, Network: taskNetwork, IdempotencyKey: fmt.Sprintf("key-%d", i),
			Fingerprint: "v1:fp", Params: json.RawMessage(`{"prompt":"p"}`)})
		if err != nil {
			t.Fatal(err)
		}
		o.ids = append(o.ids, task.ID)
	}
	return o
}
