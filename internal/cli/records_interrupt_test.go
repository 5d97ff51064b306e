package cli

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/keyspace"
)

// Ctrl-C while the confirmed release is under way does not cut it short:
// cut, its outcome would be unknown (the store may run the delete and
// lose only its answer), and the command said only "context canceled".
// The release finishes and says what it did. The delete is held up by a
// transaction that locks the record, so that the interrupt arrives while
// it waits.
func TestInterruptDuringTheReleaseLetsItFinishAndSaysSo(t *testing.T) {
	t.Parallel()
	b := holderBenches()["postgres"](t)
	ctx := context.Background()
	k, err := keyspace.Derive("images", keyspace.Scope{Tenant: "acme", User: "alice", Request: "interrupted"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.store.Claim(ctx, k.String(), idemgate.ClaimRequest{
		Fingerprint: fingerprint.Fingerprint("v1:" + strings.Repeat("ab", 32)), Owner: k.Owner(), Kind: k.Kind(),
		Lease: time.Minute, Token: claimToken(time.Now().Add(-3*time.Minute), 8*time.Minute)})
	if err != nil || res.Status != idemgate.Claimed {
		t.Fatalf("claim: %v %v", res.Status, err)
	}
	pool, err := pgxpool.New(ctx, b.env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	lock, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx) //nolint:errcheck // committed below
	if _, err := lock.Exec(ctx, "SELECT 1 FROM idemgate_records WHERE key = $1 FOR UPDATE", k.String()); err != nil {
		t.Fatal(err)
	}

	cmdCtx, interrupt := context.WithCancel(ctx)
	defer interrupt()
	type result struct {
		code           int
		stdout, stderr string
	}
	done := make(chan result, 1)
	go func() {
		code, stdout, stderr := b.run(cmdCtx, "records", "release", "-yes", "-key", k.String())
		done <- result{code, stdout, stderr}
	}()
	// Wait for the delete to wait on the lock.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE query LIKE 'DELETE FROM %idemgate_records%' AND wait_event_type = 'Lock')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the release's delete never waited on the locked record")
		}
	}
	interrupt()
	var r result
	select {
	case r = <-done: // cut short: the check below says how
	case <-time.After(3 * time.Second): // still waiting on the lock, as it should
		if err := lock.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		r = <-done
	}
	_, err = b.store.Inspect(ctx, k.String())
	released := errors.Is(err, idemgate.ErrNoRecord)
	if r.code != ExitOK || !released || !strings.Contains(r.stdout, "claim released") {
		t.Fatalf("interrupted during the release: exit %d, released %v (%v); want exit 0, the claim released and said so\nstdout: %s\nstderr: %s",
			r.code, released, err, r.stdout, r.stderr)
	}
}
