package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The short soak and the planted-bug runs start real processes (Postgres,
// redis-server, four example processes); -short skips them. make test runs
// the soak as a smoke of under a minute; the planted-bug runs are proofs
// of the checker that run apart, with make plants (go test -run TestPlants
// ./tools/chaos/ -args -plants): on every make test, each plant's history
// is fed to the checker instead (TestCheckCatchesEveryPlantsHistory).

// runPlants asks for the planted-bug runs (make plants).
var runPlants = flag.Bool("plants", false, "run the planted-bug runs (make plants)")

// TestMain removes the example binaries the runs built.
func TestMain(m *testing.M) {
	code := m.Run()
	removeBuilds()
	os.Exit(code)
}

// soakSeed is the fixed seed of the short soak and of the planted-bug runs.
const soakSeed = "1"

// soakDuration is how long the smoke injects faults. The liveness bound
// stays at 60 s: it is patience, which costs nothing when clients finish.
const soakDuration = "20s"

// keptDir finds the run directory the tool kept, in its stderr.
var keptDir = regexp.MustCompile(`kept in (\S+)`)

// toolRun is one finished run of the command.
type toolRun struct {
	args        []string
	code        int
	out, errOut string
}

// startTool runs the command in-process in the background, until it ends
// or ctx does (the test's: go test's -timeout is the patience). The runs
// wait more than they compute (a stand-in generator, fault windows, leases
// running out, the clients' last actions): side by side they take about
// as long as the longest one, which t.Parallel would not give with
// -parallel at GOMAXPROCS on a two-core machine. But a run's system (a
// Postgres, a redis-server, four example processes) keeps about one and a
// half cores busy: with slots non-nil, a run first takes one of its
// places, so that no more run at once than it holds.
func startTool(ctx context.Context, slots chan struct{}, args ...string) <-chan toolRun {
	done := make(chan toolRun, 1)
	go func() {
		if slots != nil {
			slots <- struct{}{}
			defer func() { <-slots }()
		}
		var out, errOut bytes.Buffer
		code := run(ctx, append([]string{"-json", "-q"}, args...), &out, &errOut)
		done <- toolRun{args: args, code: code, out: out.String(), errOut: errOut.String()}
	}()
	return done
}

// buildFirst builds the example binary the runs use (with the plants'
// tag when tagged) before any run starts, so that no run's system waits
// on it, with the test's patience: on a loaded machine a cold build of
// the example took more than the nine minutes a run was once given in
// all (TestSoak, 7 December 2026, load 20).
func buildFirst(t *testing.T, tagged bool) {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := buildExample(t.Context(), root, tagged); err != nil {
		t.Fatal(err)
	}
}

// summary returns the run's exit code and JSON summary, failing t if the
// run could not be made. A violated run keeps its directory for a look; a
// planted bug's expected violation needs no look unless the test failed.
func (r toolRun) summary(t *testing.T) (int, Summary) {
	t.Helper()
	if m := keptDir.FindStringSubmatch(r.errOut); m != nil {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("history and logs kept in %s", m[1])
				return
			}
			os.RemoveAll(m[1])
		})
	}
	var s Summary
	if r.code == 0 || r.code == 1 {
		if err := json.Unmarshal([]byte(r.out), &s); err != nil {
			t.Fatalf("summary: %v\n%s\n%s", err, r.out, r.errOut)
		}
	}
	if r.code == 2 {
		t.Fatalf("chaos %s could not run:\n%s", strings.Join(r.args, " "), r.errOut)
	}
	return r.code, s
}

// TestSoak is the smoke of make test: the short fixed-seed soak, once per
// records store, the two runs side by side, 20 s of faults each (the
// nemesis deals every kind in its first round however short the window;
// make chaos runs the long soak): every fault kind that applies, every invariant must hold; with
// the records in Postgres, invariant 7 allows no second charge at all.
// The Postgres run has short leases (1-2 s: faults outlast them,
// generations and exports live on renewals): there a renewal that comes
// too late on a busy machine rolls the export back. On Redis it lets a
// retry run the export again, which invariant 7 counts, so the Redis run,
// like the limits and flood modes, is left to the long runs: make test
// runs beside everything else.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the soak runs real processes for most of a minute")
	}
	buildFirst(t, false)
	stores := []string{"redis", "postgres"}
	modes := map[string]string{"redis": "none", "postgres": "short-lease"}
	runs := map[string]<-chan toolRun{}
	for _, store := range stores {
		runs[store] = startTool(t.Context(), nil, "-seed", soakSeed, "-duration", soakDuration, "-bound", "60s", "-store", store, "-modes", modes[store])
	}
	for _, store := range stores {
		t.Run(store, func(t *testing.T) {
			code, s := (<-runs[store]).summary(t)
			for _, r := range s.Invariants {
				if !r.Holds {
					t.Errorf("invariant %d (%s) violated %d times, e.g.:\n  %s", r.N, r.Name, r.Violations, strings.Join(r.Examples, "\n  "))
				}
			}
			if code != 0 {
				t.Errorf("exit code %d, want 0", code)
			}
			// A soak that injected nothing or accepted nothing proves
			// nothing: the nemesis deals every kind in its first round in
			// full, past the window if it must, so every kind is met.
			kinds, err := parseKinds("all", store)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range kinds {
				if s.Faults[k] == 0 {
					t.Errorf("no %s fault injected: %v", k, s.Faults)
				}
			}
			if s.Tasks["succeeded"] < 20 || s.GenCalls == 0 || s.Exports == 0 {
				t.Errorf("the soak did too little: tasks %v, %d generator calls, %d exports", s.Tasks, s.GenCalls, s.Exports)
			}
			t.Logf("faults %v; tasks %v; %d generator calls; %d export runs", s.Faults, s.Tasks, s.GenCalls, s.Exports)
		})
	}
}

// TestPlants plants each known bug and requires the checker to catch it
// with a fixed seed: the invariant the plant names is violated and the
// tool exits 1. A plant whose hook is not in the tree fails: the tool
// refuses to run it.
//
// The plants run two at a time. On a loaded machine a plant's fault can
// fail to land where the bug shows (a commit-kill needs an export to
// commit within its wait, and the kill to land before the node's next
// write): a plant missed there runs once more, twice as long as its first
// run, and must be caught then. The first miss is logged, so that a
// checker that only catches a bug at the second try is seen.
func TestPlants(t *testing.T) {
	if !*runPlants {
		t.Skip("the planted-bug runs are make plants' (-args -plants); make test feeds each plant's history to the checker")
	}
	if testing.Short() {
		t.Skip("-short: planted-bug runs start real processes")
	}
	buildFirst(t, true)
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	args := func(p plant, duration string) []string { // duration: time.Duration.String
		a := []string{"-plant", p.Name, "-seed", soakSeed, "-duration", duration, "-bound", "45s", "-faults", p.Faults, "-modes", "none"}
		if p.Store != "" {
			a = append(a, "-store", p.Store)
		}
		return a
	}
	// Two plants at a time: five side by side (seven systems on two
	// cores, with the other packages' tests) made most of them miss at
	// the first run, and their second runs cost more than waiting.
	slots := make(chan struct{}, 2)
	runs := make([]<-chan toolRun, len(plants))
	for i, p := range plants {
		if p.Caught == 0 || !p.hooked(root) {
			continue // its subtest says why
		}
		d := p.TestDuration
		if d == 0 {
			d = 12 * time.Second
		}
		runs[i] = startTool(t.Context(), slots, args(p, d.String())...)
	}
	// Results are read in order; a missed plant's second run waits for
	// the first round to end, so it runs on a quieter machine.
	var again []int
	missed := make([]string, len(plants))
	for i, p := range plants {
		t.Run(p.Name, func(t *testing.T) {
			if p.Caught == 0 {
				t.Fatalf("%s names no invariant that catches it", p.Name)
			}
			if runs[i] == nil {
				t.Fatalf("no hook for %s in any of %s: the plant cannot be put back", p.Name, strings.Join(p.Pkgs, ", "))
			}
			if why := plantMissed(t, p, <-runs[i]); why != "" {
				missed[i] = why
				again = append(again, i)
				t.Logf("missed at the first run, run again alone: %s", why)
			}
		})
	}
	for _, i := range again {
		p := plants[i]
		t.Run(p.Name+"-again", func(t *testing.T) {
			d := 2 * max(p.TestDuration, 12*time.Second)
			if why := plantMissed(t, p, <-startTool(t.Context(), nil, args(p, d.String())...)); why != "" {
				t.Errorf("%s; the first run too: %s", why, missed[i])
			}
		})
	}
}

// plantMissed returns why the run r of plant p shows that the checker
// missed the bug, "" if it caught it: its invariant broken, exit code 1.
func plantMissed(t *testing.T, p plant, r toolRun) string {
	t.Helper()
	code, s := r.summary(t)
	var why []string
	if code != 1 {
		why = append(why, fmt.Sprintf("exit code %d with %s planted, want 1", code, p.Name))
	}
	for _, inv := range s.Invariants {
		if inv.N == p.Caught && inv.Holds {
			why = append(why, fmt.Sprintf("invariant %d holds with %s planted: the checker missed the bug (faults %v; tasks %v; %d generator calls; %d export runs)",
				inv.N, p.Name, s.Faults, s.Tasks, s.GenCalls, s.Exports))
		}
		if !inv.Holds {
			t.Logf("invariant %d violated %d times, e.g. %s", inv.N, inv.Violations, inv.Examples[0])
		}
	}
	return strings.Join(why, "; ")
}

// TestPlantList prints every plant and says which have hooks.
func TestPlantList(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if code := run(context.Background(), []string{"-plant", "list"}, &out, &out); code != 0 {
		t.Fatalf("exit %d: %s", code, out.String())
	}
	for _, p := range plants {
		if !strings.Contains(out.String(), p.Name) {
			t.Errorf("-plant list does not name %s:\n%s", p.Name, out.String())
		}
	}
}

// TestCheckFile checks a recorded history again: exit 1 for a violating
// one, 0 for a clean one.
func TestCheckFile(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		h    History
		want int
	}{
		{"clean", healthy("uncertain").h, 0},
		{"false replay", func() History {
			f := healthy("uncertain")
			f.submit("acme", "alice", "poster:1", Params{Prompt: "a cat", AspectRatio: "1:1", N: 1}, 202, "T1", true)
			return f.h
		}(), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := t.TempDir() + "/history.jsonl"
			writeHistory(t, path, tc.h)
			var out bytes.Buffer
			if code := run(context.Background(), []string{"-check", path}, &out, &out); code != tc.want {
				t.Fatalf("exit %d, want %d:\n%s", code, tc.want, out.String())
			}
			if !strings.Contains(out.String(), "invariant") {
				t.Errorf("no summary table:\n%s", out.String())
			}
		})
	}
}
