package pgstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// SubmitTx lists a line once every listedFor, not at every call: a busy
// line's SubmitTx costs no extra round trip. The memory is an
// optimization only: with the line's row gone behind its back, the next
// SubmitTx's transaction lists the line itself and its task is claimed.
func TestSubmitTxRemembersTheLinesItListed(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	submitTx := func(key string) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			_, err := s.SubmitTx(ctx, tx, tenantTask("busy", key))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	submitTx("k-1")
	line := waitingLine{Kind: tenantTask("busy", "k").Kind, Tenant: "busy"}
	if !s.listed.recent(line, s.elapsed()) {
		t.Fatalf("the line SubmitTx listed is not remembered")
	}
	if s.listed.recent(line, s.elapsed()+listedFor) {
		t.Fatalf("a line is remembered past listedFor")
	}
	if _, err := s.pool.Exec(ctx, `DELETE FROM idemgate_waiting_tenants`); err != nil {
		t.Fatal(err)
	}
	submitTx("k-2")
	if n := orphanLines(t, s); n != 0 {
		t.Fatalf("%d lines with waiting tasks are not listed after a remembered line's row was deleted", n)
	}
}

// The memory is bounded: past listedMax lines it starts over.
func TestListedLinesAreBounded(t *testing.T) {
	t.Parallel()
	var l listedLines
	for i := range listedMax + 1 {
		l.add(waitingLine{Kind: "image", Tenant: fmt.Sprint(i)}, time.Duration(i))
	}
	if len(l.seen) != 1 {
		t.Fatalf("%d lines remembered after %d added; want the memory started over (1)", len(l.seen), listedMax+1)
	}
	if l.recent(waitingLine{Kind: "image", Tenant: "0"}, listedMax) {
		t.Fatalf("a line from before the memory started over is still remembered")
	}
}
