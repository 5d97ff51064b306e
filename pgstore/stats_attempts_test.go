package pgstore

import (
	"context"
	"testing"
)

// Stats.Attempts counts what a claim counts against a kind's limits:
// running attempts whose lease has not ended and Reconcile calls whose
// claim has not lapsed; not an expired lease no rescue has taken back
// yet, nor an uncertain task waiting for its Reconcile. Counts, by state
// as stored, counted the expired lease as running and left the running
// Reconcile out (running 2 against 2 counted by the claim, but not the
// same two).
func TestStatsCountsTheAttemptsAClaimCounts(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	for _, g := range []struct{ key, set string }{
		{"live", "state = 'running', attempt = 1, lease_until = now() + interval '1 minute'"},
		{"expired", "state = 'running', attempt = 1, lease_until = now() - interval '1 second'"},
		{"reconciling", "state = 'uncertain', attempt = 2, locked_by = 'w', run_after = now() + interval '1 minute'"},
		{"lapsed", "state = 'uncertain', attempt = 2, locked_by = 'w', run_after = now() - interval '1 second'"},
		{"waiting", "state = 'uncertain', attempt = 1"},
		{"pending", "attempt = 0"},
	} {
		task := mustSubmit(t, s, newTask(g.key))
		if _, err := s.pool.Exec(ctx, "UPDATE idemgate_tasks SET "+g.set+" WHERE id = $1::uuid", task.ID); err != nil {
			t.Fatal(err)
		}
	}
	// A cancelled attempt that holds its task counts until it stopped.
	held := mustSubmit(t, s, newTask("cancelled-held"))
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'running', attempt = 1,
	lease_until = now() + interval '1 minute' WHERE id = $1::uuid`, held.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Operator().Cancel(ctx, held.ID); err != nil {
		t.Fatal(err)
	}
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Attempts["image"]; got != 3 {
		t.Errorf("Attempts[image] = %d; want 3 (live, reconciling, cancelled-held)", got)
	}
	if got := st.Counts["image"][StateRunning]; got != 3 {
		t.Errorf("Counts[image][running] = %d; want 3 (live, expired, cancelled-held: as stored)", got)
	}
	if _, ok := st.Counts["image"][State(statsHolding)]; ok {
		t.Errorf("Counts has a %q state", statsHolding)
	}
}
