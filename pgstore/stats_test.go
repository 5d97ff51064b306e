package pgstore

import (
	"context"
	"testing"
	"time"
)

func TestStats(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	empty, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(empty.Counts) != 0 || empty.OldestRunnable != 0 || empty.OldestUncertain != 0 {
		t.Fatalf("Stats of an empty table = %+v; want zeros", empty)
	}
	given := []struct {
		key, kind string
		set       string // SQL SET clause
	}{
		{"p1", "image", "run_after = now() - interval '90 seconds'"},
		{"p2", "image", "run_after = now() + interval '1 hour'"}, // not runnable yet
		{"r1", "image", "state = 'running'"},
		{"u1", "image", "state = 'uncertain', created_at = now() - interval '2 hours'"},
		{"u2", "video", "state = 'uncertain', created_at = now() - interval '3 hours'"},
		{"y1", "video", "state = 'retrying', run_after = now() - interval '10 minutes'"},
		{"s1", "video", "state = 'succeeded', results = '[1]', created_at = now() - interval '9 hours'"},
		{"c1", "video", "state = 'cancelled', created_at = now() - interval '9 hours'"},
	}
	for _, g := range given {
		nt := newTask(g.key)
		nt.Kind = g.kind
		task := mustSubmit(t, s, nt)
		if _, err := s.pool.Exec(ctx, "UPDATE idemgate_tasks SET "+g.set+" WHERE id = $1::uuid", task.ID); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]map[State]int{
		"image": {StatePending: 2, StateRunning: 1, StateUncertain: 1},
		"video": {StateUncertain: 1, StateRetrying: 1},
	}
	if len(got.Counts) != len(want) {
		t.Fatalf("Counts = %v; want %v", got.Counts, want)
	}
	for kind, states := range want {
		if len(got.Counts[kind]) != len(states) {
			t.Fatalf("Counts[%s] = %v; want %v", kind, got.Counts[kind], states)
		}
		for st, n := range states {
			if got.Counts[kind][st] != n {
				t.Fatalf("Counts[%s][%s] = %d; want %d", kind, st, got.Counts[kind][st], n)
			}
		}
	}
	// Ages are measured by the database: allow for the statements between.
	if got.OldestRunnable < 10*time.Minute || got.OldestRunnable > 11*time.Minute {
		t.Errorf("OldestRunnable = %v; want the retrying task's 10 minutes", got.OldestRunnable)
	}
	if got.OldestUncertain < 3*time.Hour || got.OldestUncertain > 3*time.Hour+time.Minute {
		t.Errorf("OldestUncertain = %v; want the 3 hours of the older uncertain task", got.OldestUncertain)
	}
}

func TestSubmitKeepsTheTrace(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	nt := newTask("traced")
	nt.Trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	first := mustSubmit(t, s, nt)
	again := mustSubmit(t, s, nt)
	got := mustGet(t, s, first)
	if first.Trace != nt.Trace || again.Trace != nt.Trace || got.Trace != nt.Trace {
		t.Fatalf("traces %q, %q, %q; want %q each time", first.Trace, again.Trace, got.Trace, nt.Trace)
	}
	if plain := mustSubmit(t, s, newTask("untraced")); plain.Trace != "" {
		t.Fatalf("untraced task has trace %q", plain.Trace)
	}
}
