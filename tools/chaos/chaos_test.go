package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The short soak and the planted-bug runs start real processes (Postgres,
// redis-server, four example processes) and take minutes; -short skips them.

// soakSeed is the fixed seed of the short soak and of the planted-bug runs.
const soakSeed = "1"

// keptDir finds the run directory the tool kept, in its stderr.
var keptDir = regexp.MustCompile(`kept in (\S+)`)

// runTool runs the command in-process and returns its exit code and the
// JSON summary.
func runTool(t *testing.T, args ...string) (int, Summary) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	code := run(ctx, append([]string{"-json", "-q"}, args...), &out, &errOut)
	// A violated run keeps its directory for a look; a planted bug's
	// expected violation needs no look unless the test failed.
	if m := keptDir.FindStringSubmatch(errOut.String()); m != nil {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("history and logs kept in %s", m[1])
				return
			}
			os.RemoveAll(m[1])
		})
	}
	var s Summary
	if code == 0 || code == 1 {
		if err := json.Unmarshal(out.Bytes(), &s); err != nil {
			t.Fatalf("summary: %v\n%s\n%s", err, out.String(), errOut.String())
		}
	}
	if code == 2 {
		t.Fatalf("chaos %s could not run:\n%s", strings.Join(args, " "), errOut.String())
	}
	return code, s
}

// TestSoak is the short fixed-seed soak, once per records store, side by
// side: every fault kind that applies, every invariant must hold; with
// the records in Postgres, invariant 7 allows no second charge at all.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the soak runs real processes for about a minute")
	}
	for _, store := range []string{"redis", "postgres"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			code, s := runTool(t, "-seed", soakSeed, "-duration", "45s", "-bound", "60s", "-store", store)
			for _, r := range s.Invariants {
				if !r.Holds {
					t.Errorf("invariant %d (%s) violated %d times, e.g.:\n  %s", r.N, r.Name, r.Violations, strings.Join(r.Examples, "\n  "))
				}
			}
			if code != 0 {
				t.Errorf("exit code %d, want 0", code)
			}
			// A soak that injected nothing or accepted nothing proves
			// nothing: the nemesis deals every kind in each round, so 45 s
			// meets them all.
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
func TestPlants(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: planted-bug runs start real processes")
	}
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range plants {
		t.Run(p.Name, func(t *testing.T) {
			// The runs wait far more than they compute (a stand-in
			// generator, fault windows, the clients' last actions): side
			// by side they take about as long as the longest one. Each
			// needs only its own invariant broken, which load does not
			// prevent.
			t.Parallel()
			if p.Caught == 0 {
				t.Fatalf("%s names no invariant that catches it", p.Name)
			}
			if !p.hooked(root) {
				t.Fatalf("no hook for %s in any of %s: the plant cannot be put back", p.Name, strings.Join(p.Pkgs, ", "))
			}
			args := []string{"-plant", p.Name, "-seed", soakSeed, "-duration", "12s", "-bound", "45s", "-faults", p.Faults}
			if p.Store != "" {
				args = append(args, "-store", p.Store)
			}
			code, s := runTool(t, args...)
			if code != 1 {
				t.Errorf("exit code %d with %s planted, want 1", code, p.Name)
			}
			for _, r := range s.Invariants {
				if r.N == p.Caught && r.Holds {
					t.Errorf("invariant %d holds with %s planted: the checker missed the bug", r.N, p.Name)
				}
				if !r.Holds {
					t.Logf("invariant %d violated %d times, e.g. %s", r.N, r.Violations, r.Examples[0])
				}
			}
		})
	}
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
