package main

import (
	"strings"
	"testing"
)

// plantHistories are, per planted bug, a history of the kind its run
// records when the bug shows, with the faults the plant is run under:
// what the checker must catch without a run. TestPlants (make plants)
// proves that a real run records such a history; these prove, on every
// make test, that the checker still reads it as a violation of the
// plant's invariant.
var plantHistories = map[string]func() *fixture{
	// The middleware replays a finished record whatever the fingerprint:
	// a reworded retry under the old key gets the old task.
	"replay-ignores-fingerprint": func() *fixture {
		f := healthy("uncertain")
		f.h.Faults = append(f.h.Faults, Fault{Kind: "latency", Target: "api0", Start: at(2.2), End: at(2.8),
			Detail: "api0→redis for 600ms (+50ms per chunk)"})
		f.submit("acme", "alice", "poster:1", Params{Prompt: "a cat", AspectRatio: "1:1", N: 1}, 202, "T1", true)
		return f
	},
	// The export's complete answer is released when its client is gone:
	// the client's retry runs the export again and gets a second ledger
	// row. The latency that made the client give up was on the other
	// node, which loses no answer of api0's.
	"release-on-client-gone": func() *fixture {
		f := healthy("uncertain")
		f.h.Faults = append(f.h.Faults, Fault{Kind: "latency", Target: "api1", Start: at(5.9), End: at(6.2),
			Detail: "api1→redis for 300ms (+80ms per chunk)"})
		f.exportRun(2, "acme", "alice", "export:1", "T1", "api0", 6.5)
		last := &f.h.Requests[len(f.h.Requests)-1]
		last.ExportID, last.Replayed = 2, false
		return f
	},
	// The rescuer requeues a running task whatever its lease: the paused
	// worker's live attempt is handed to the other worker, and the
	// generator runs twice under the uncertain policy.
	"rescue-unfenced": func() *fixture {
		f := healthy("uncertain")
		f.h.Rows[0].Attempt = 2
		f.h.Faults = append(f.h.Faults, Fault{Kind: "pause", Target: "worker0", Start: at(3), End: at(3.8)})
		f.gen("T1", "worker1", 4.5)
		return f
	},
	// Submit does not compare the task that holds the key: after Redis
	// forgot the key, a reworded retry gets the old task.
	"skip-readback": func() *fixture {
		f := healthy("uncertain")
		f.h.Faults = append(f.h.Faults, Fault{Kind: "flushall", Start: at(7), End: at(7)})
		f.submit("acme", "alice", "poster:1", Params{Prompt: "a cat", AspectRatio: "1:1", N: 1}, 202, "T1", true)
		f.h.Requests[len(f.h.Requests)-1].Sent = at(8)
		f.h.Requests[len(f.h.Requests)-1].Done = at(8.1)
		return f
	},
	// Records in Postgres, the record completed after the handler's
	// transaction: api0 killed once its export committed, before the
	// answer was stored; the retry on api1 charges again.
	"complete-outside-tx": func() *fixture {
		f := healthy("uncertain")
		f.h.Meta.Store = "postgres"
		f.h.Faults = append(f.h.Faults,
			Fault{Kind: "commit-kill", Target: "api0", Start: at(5.8), End: at(7),
				Detail: "api0→pg +20ms per chunk: killed once export 1 committed"},
			Fault{Kind: "latency", Target: "api1", Start: at(5.8), End: at(6.4),
				Detail: "api1→pg +20ms per chunk during a commit-kill"})
		f.exportRun(2, "acme", "alice", "export:1", "T1", "api1", 6.5)
		last := &f.h.Requests[len(f.h.Requests)-1]
		last.ExportID, last.Replayed = 2, false
		return f
	},
}

// TestCheckCatchesEveryPlantsHistory feeds the checker, for every plant,
// the history its bug leaves: the plant's invariant must be violated. A
// plant with no history here fails, so that no planted bug is proved only
// by the runs make plants makes.
func TestCheckCatchesEveryPlantsHistory(t *testing.T) {
	t.Parallel()
	for _, p := range plants {
		t.Run(p.Name, func(t *testing.T) {
			t.Parallel()
			given, ok := plantHistories[p.Name]
			if !ok {
				t.Fatalf("no history for plant %s in plantHistories", p.Name)
			}
			h := given().h
			if p.Store == "postgres" && h.Meta.Store != "postgres" {
				t.Fatalf("plant %s runs with records in Postgres; its history says %q", p.Name, h.Meta.Store)
			}
			for _, r := range Check(h) {
				if r.N == p.Caught {
					if r.Holds {
						t.Fatalf("invariant %d holds on the history of %s: the checker misses the bug", r.N, p.Name)
					}
					t.Logf("invariant %d: %s", r.N, strings.Join(r.Examples, "; "))
					return
				}
			}
			t.Fatalf("Check returned no invariant %d", p.Caught)
		})
	}
	for name := range plantHistories {
		if _, ok := findPlant(name); !ok {
			t.Errorf("plantHistories has %s, which is no plant", name)
		}
	}
}
