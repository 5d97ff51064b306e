// Package opsbench gives tests a migrated pgstore database, and the
// operator tools' and queue routes' tests one with a few tasks of two
// tenants.
package opsbench

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/pgstore"
)

// Bench is a migrated database holding three pending tasks: acme's
// "images" task, acme's "music" task and globex's "images" task, in that
// order in IDs.
type Bench struct {
	DSN   string
	Pool  *pgxpool.Pool
	Store *pgstore.Store
	IDs   []string
}

// Seed migrates the database at dsn and submits the three tasks with the
// given runtime and network. The pool closes when t ends.
func Seed(t testing.TB, dsn, runtime, network string) *Bench {
	t.Helper()
	ctx := context.Background()
	pool, store := Migrated(t, dsn)
	b := &Bench{DSN: dsn, Pool: pool, Store: store}
	for i, nt := range []struct{ tenant, kind string }{{"acme", "images"}, {"acme", "music"}, {"globex", "images"}} {
		task, err := store.Submit(ctx, pgstore.NewTask{Tenant: nt.tenant, Owner: "owner", Kind: nt.kind,
			Runtime: runtime, Network: network, IdempotencyKey: fmt.Sprintf("key-%d", i),
			Fingerprint: "v1:fp", Params: json.RawMessage(`{"prompt":"p"}`)})
		if err != nil {
			t.Fatal(err)
		}
		b.IDs = append(b.IDs, task.ID)
	}
	return b
}

// Migrated returns a pool on the database at dsn, closed when t ends, and
// a pgstore.Store on it whose schema is migrated.
func Migrated(t testing.TB, dsn string) (*pgxpool.Pool, *pgstore.Store) {
	t.Helper()
	ctx := context.Background()
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
	return pool, store
}
