package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
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

// Stats while tasks are submitted (single and batched), claimed
// and finished by a running worker, from many goroutines: no error, no
// negative count or age, never more unfinished tasks than were submitted,
// and nothing left at the end.
func TestStatsUnderChurn(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := newWorker(t, s, WorkerConfig{Kinds: []string{"image", "audio"}, Concurrency: 8,
		Handler: func(context.Context, Task) Outcome { return Succeeded(json.RawMessage(`1`)) }})
	runDone := make(chan error, 1)
	go func() { runDone <- w.Run(ctx) }()
	defer func() { cancel(); <-runDone }()
	const submitters, per = 6, 100
	var wg sync.WaitGroup
	for g := range submitters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				nt := newTask(fmt.Sprint("churn-", g, "-", i))
				if i%2 == 1 {
					nt.Kind = "audio"
				}
				nt.Priority = i % 5
				if g%2 == 0 {
					if _, err := s.Submit(ctx, nt); err != nil {
						t.Error(err)
						return
					}
				} else if res, err := s.SubmitMany(ctx, []NewTask{nt}); err != nil || res[0].Err != nil {
					t.Error(err, res)
					return
				}
			}
		}()
	}
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for range 4 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				st, err := s.Stats(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				total := 0
				for kind, m := range st.Counts {
					for state, n := range m {
						if n <= 0 {
							t.Errorf("Stats: %s %s = %d", kind, state, n)
						}
						total += n
					}
				}
				if total > submitters*per || st.OldestRunnable < 0 || st.OldestUncertain != 0 {
					t.Errorf("Stats: %+v", st)
				}
			}
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := s.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Counts) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tasks left unfinished: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	readers.Wait()
}

// Stats reads about as much with a large history of finished tasks as
// without it: it reads the unfinished tasks through their partial
// indexes, never the whole table.
func TestStatsIgnoresFinishedTasks(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	for i, state := range []State{StatePending, StateRunning, StateRetrying, StateUncertain} {
		task := mustSubmit(t, s, newTask(fmt.Sprint("open-", i)))
		if _, err := s.pool.Exec(ctx, "UPDATE idemgate_tasks SET state = $1 WHERE id = $2", state, task.ID); err != nil {
			t.Fatal(err)
		}
	}
	statsBuffers := func() int {
		var plan []map[string]any
		if err := s.pool.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sqlStats).Scan(&plan); err != nil {
			t.Fatal(err)
		}
		top := plan[0]["Plan"].(map[string]any)
		return int(top["Shared Hit Blocks"].(float64) + top["Shared Read Blocks"].(float64))
	}
	if _, err := s.pool.Exec(ctx, "ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
	before := statsBuffers()
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, state, finished_at)
		SELECT 'acme', 'o', 'image', 'gpu', 'main', 'done-' || g, 'f',
			(ARRAY['succeeded', 'failed', 'cancelled'])[1 + g % 3], now() - g * interval '1 second'
		FROM generate_series(1, 50000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, "ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
	after := statsBuffers()
	t.Logf("Stats buffers: %d with 4 unfinished tasks, %d with 50k finished ones besides", before, after)
	if after > 2*before+8 {
		t.Fatalf("Stats read %d buffers with 50k finished tasks, %d without", after, before)
	}
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, state := range []State{StatePending, StateRunning, StateRetrying, StateUncertain} {
		if n := st.Counts["image"][state]; n != 1 {
			t.Errorf("Stats counted %d %s tasks, want 1", n, state)
		}
	}
}
