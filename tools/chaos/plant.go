package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Planted bugs are known defects put back on purpose, to prove that the
// checker catches them. They live behind the build tag plantTag in small
// hooks inside the library (a file built only with the tag reads the
// plant's name from plantEnv; the file built without it declares the
// name as the constant "", so a normal build carries nothing). The chaos
// tool builds the example with the tag and sets the variable.
const (
	plantTag = "chaosplant"
	plantEnv = "IDEMGATE_CHAOS_PLANT"
)

// plant is one bug that can be planted.
type plant struct {
	Name string
	// Pkgs are the package directories (from the module root; "." is
	// the engine's root package) one of which holds the hook that plants
	// the bug.
	Pkgs []string
	// What the bug does, and which invariant catches it.
	Bug    string
	Caught int
	// Faults are the fault kinds that make the bug show; "" for all.
	Faults string
	// Store is the -store the bug shows under; "" for the default.
	Store string
	// Hook is the text the plant's hook leaves in a file of Pkg other
	// than the plant files; "" means the plant's quoted name.
	Hook string
	// TestDuration is how long TestPlants injects faults for it; 0 means
	// 12 s. A bug that shows only when a fault lands on a rarer event
	// (a commit-kill on an export) gets longer.
	TestDuration time.Duration
}

// plants are the bugs -plant knows, each caught by a fixed seed in the
// short run of the tests.
var plants = []plant{
	{
		Name: "replay-ignores-fingerprint", Pkgs: []string{"."}, Caught: 2,
		Bug:    "a finished record is replayed whatever fingerprint the retry carries: a reworded retry gets the old task",
		Faults: "pause,latency",
	},
	{
		Name: "release-on-client-gone", Pkgs: []string{"."}, Caught: 7,
		Bug: "a handler's complete response is released, not stored, when its client is gone (write error or closed request): " +
			"the client's retry runs the handler again; the export route's ledger gets a second charge for one key",
		Faults: "pause,latency",
	},
	{
		Name: "rescue-unfenced", Pkgs: []string{"pgstore"}, Caught: 5, Hook: "plantSQL(sqlRescue)",
		Bug:    "the rescuer requeues running tasks whatever their lease: a live attempt is handed out again and the generator runs twice",
		Faults: "pause,latency",
	},
	{
		Name: "skip-readback", Pkgs: []string{"pgstore"}, Caught: 2,
		Bug:    "Submit does not read back and compare the task that holds the key: after Redis forgets a key, a reworded retry gets the old task",
		Faults: "flushall,redis-restart,latency",
	},
	{
		Name: "complete-outside-tx", Pkgs: []string{".", "pgrecords"}, Caught: 7, Store: "postgres",
		Bug: "an Atomic route's record is completed after the handler's transaction committed, not in it: " +
			"a node killed in between leaves the export's ledger row without its stored answer, and the retry charges again",
		Faults: "commit-kill",
		// A commit-kill needs an export to commit within its wait; side
		// by side with the other plants, 12 s saw only four exports.
		TestDuration: 24 * time.Second,
	},
}

// findPlant returns the plant called name.
func findPlant(name string) (plant, bool) {
	for _, p := range plants {
		if p.Name == name {
			return p, true
		}
	}
	return plant{}, false
}

// hooked reports whether the hook of p exists in the module at root: a Go
// file of one of its packages, not a test and not one of the plant files
// (plant_chaos.go, plant_off.go), that holds p.Hook.
func (p plant) hooked(root string) bool {
	hook := p.Hook
	if hook == "" {
		hook = `"` + p.Name + `"`
	}
	for _, pkg := range p.Pkgs {
		files, _ := filepath.Glob(filepath.Join(root, pkg, "*.go"))
		for _, f := range files {
			if base := filepath.Base(f); strings.HasSuffix(base, "_test.go") || strings.HasPrefix(base, "plant_") {
				continue
			}
			b, err := os.ReadFile(f)
			if err == nil && strings.Contains(string(b), hook) {
				return true
			}
		}
	}
	return false
}

// listPlants prints the plants and whether their hooks exist.
func listPlants(w io.Writer, root string) {
	for _, p := range plants {
		state := "hook missing"
		if p.hooked(root) {
			state = "hooked"
		}
		store := p.Store
		if store == "" {
			store = "redis"
		}
		fmt.Fprintf(w, "%-28s %-20s %-8s invariant %d  %-12s %s\n", p.Name, strings.Join(p.Pkgs, ","), store, p.Caught, state, p.Bug)
	}
}
