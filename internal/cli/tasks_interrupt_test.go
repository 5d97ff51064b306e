package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/pgstore"
)

// Ctrl-C while a task's cancel is under way, after it was confirmed,
// does not cut it short: cut, its outcome would be unknown, and the
// command said only "context canceled". The cancel finishes and the
// command prints the task it changed. The update is held up by a
// transaction that locks the task's row, so that the interrupt arrives
// while it waits.
func TestInterruptDuringATaskCancelLetsItFinishAndSaysSo(t *testing.T) {
	t.Parallel()
	o := newOpsBench(t)
	ctx := context.Background()
	id := o.IDs[0]
	lock, err := o.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx) //nolint:errcheck // committed below
	if _, err := lock.Exec(ctx, "SELECT 1 FROM idemgate_tasks WHERE id = $1 FOR UPDATE", id); err != nil {
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
		var stdout, stderr bytes.Buffer
		code := Main(cmdCtx, []string{"tasks", "cancel", id, "-yes"}, Env{Prog: "idemgate",
			Getenv: func(k string) string { return map[string]string{"DATABASE_URL": o.DSN}[k] },
			Stdin:  strings.NewReader(""), Stdout: &stdout, Stderr: &stderr})
		done <- result{code, stdout.String(), stderr.String()}
	}()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		var waiting bool
		if err := o.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cancel never waited on the locked task")
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
	var state pgstore.State
	if err := o.Pool.QueryRow(ctx, "SELECT state FROM idemgate_tasks WHERE id = $1", id).Scan(&state); err != nil {
		t.Fatal(err)
	}
	if r.code != ExitOK || state != pgstore.StateCancelled || !strings.Contains(r.stdout, "cancelled") {
		t.Fatalf("interrupted during the cancel: exit %d, task %s; want exit 0, the task cancelled and shown\nstdout: %s\nstderr: %s",
			r.code, state, r.stdout, r.stderr)
	}
}
