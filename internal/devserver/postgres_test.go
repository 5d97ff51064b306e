package devserver

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestStartPostgresGivesEachServerAFreshCluster: servers start from a copy
// of one pristine cluster, so what one server writes is in no other
// server's cluster, and the pristine one is never run.
func TestStartPostgresGivesEachServerAFreshCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts PostgreSQL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	exec := func(p *Postgres, sql string) error {
		conn, err := pgx.Connect(ctx, p.DSN("postgres"))
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	first, err := StartPostgres(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := exec(first, "CREATE TABLE written_by_the_first (x int)"); err != nil {
		t.Fatal(err)
	}
	second, err := StartPostgres(ctx)
	if err != nil {
		first.Stop()
		t.Fatal(err)
	}
	defer second.Stop()
	first.Stop() // the first server's writes are on disk, its directory gone
	if err := exec(second, "CREATE TABLE written_by_the_first (x int)"); err != nil {
		t.Errorf("the second server's cluster is not fresh: %v", err)
	}
	initdb, err := lookPath("initdb", pgDirs...)
	if err != nil {
		t.Fatal(err)
	}
	cred, err := credential()
	if err != nil {
		t.Fatal(err)
	}
	pristine, err := pristineCluster(ctx, initdb, "postgres", cred)
	if err != nil {
		t.Fatalf("no pristine cluster: %v", err)
	}
	if _, err := os.Stat(filepath.Join(pristine, "postmaster.pid")); !os.IsNotExist(err) {
		t.Errorf("the pristine cluster %s has a postmaster.pid (%v): a server ran on it", pristine, err)
	}
	if second.datadir == pristine || first.datadir == pristine {
		t.Errorf("a server runs on the pristine cluster %s", pristine)
	}
}

// BenchmarkStartPostgres is what a test binary or a chaos run pays for
// its server: start and stop (go test -run '^$' -bench StartPostgres
// -benchtime 5x ./internal/devserver/).
func BenchmarkStartPostgres(b *testing.B) {
	ctx := context.Background()
	for b.Loop() {
		p, err := StartPostgres(ctx)
		if err != nil {
			b.Fatal(err)
		}
		p.Stop()
	}
}
