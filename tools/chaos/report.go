package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"

	"github.com/idemgate/idemgate"
)

// Summary is the report of a run.
type Summary struct {
	Seed     int64  `json:"seed"`
	Duration string `json:"duration"`
	Store    string `json:"store"`
	Plant    string `json:"plant,omitempty"`
	// Modes names the run's modes and timings (short-lease, limits, flood).
	Modes    string         `json:"modes"`
	Faults   map[string]int `json:"faults"`
	Requests map[string]int `json:"requests"`
	Actions  map[string]int `json:"actions"`
	Tasks    map[string]int `json:"tasks"`
	GenCalls int            `json:"generator_calls"`
	// Exports counts the runs of the export handler (its ledger's rows).
	Exports int `json:"exports"`
	// CallsFrom says where the calls were counted: the upstream's call log
	// (at their start) or the workers' logs (at their end).
	CallsFrom string `json:"calls_from"`
	// Notes are oddities that break no invariant but deserve a look, e.g.
	// a byte-identical retry refused with key_reused (a false conflict is
	// safe, but it should not happen).
	Notes      map[string]int `json:"notes,omitempty"`
	Invariants []Result       `json:"invariants"`
	Holds      bool           `json:"holds"`
}

func summarize(h History) Summary {
	s := Summary{Seed: h.Meta.Seed, Duration: h.Meta.Duration.String(), Plant: h.Meta.Plant, Store: h.Meta.Store,
		Faults: map[string]int{}, Requests: map[string]int{}, Actions: map[string]int{}, Tasks: map[string]int{},
		Modes: plan{modes: h.Meta.Modes, lease: h.Meta.Lease, genTime: h.Meta.GenTime, exportTime: h.Meta.ExportTime}.String()}
	for _, f := range h.Faults {
		s.Faults[f.Kind]++
	}
	for _, q := range h.Requests {
		s.Requests[outcomeOf(q)]++
	}
	for _, a := range h.Actions {
		s.Actions[a.Scenario+" → "+a.Outcome]++
	}
	for _, w := range h.Rows {
		s.Tasks[w.State]++
	}
	counted := "end"
	s.CallsFrom = "worker logs (at their end)"
	if h.Meta.Starts {
		counted, s.CallsFrom = "start", "upstream call log (at their start)"
	}
	for _, g := range h.Gen {
		if g.Phase == counted {
			s.GenCalls++
		}
	}
	s.Exports = len(h.Exports)
	s.Notes = notes(h)
	s.Invariants = Check(h)
	s.Holds = Holds(s.Invariants)
	return s
}

// notes counts oddities that break no invariant.
func notes(h History) map[string]int {
	type clientKey struct{ tenant, user, key string }
	accepted := map[clientKey]string{} // fingerprint of the first 2xx
	for _, q := range h.Requests {
		k := clientKey{q.Tenant, q.User, q.Key}
		if _, seen := accepted[k]; !seen && q.Route == routeSubmit && ok2xx(q) {
			accepted[k] = q.FP
		}
	}
	out := map[string]int{}
	for _, q := range h.Requests {
		fp, seen := accepted[clientKey{q.Tenant, q.User, q.Key}]
		if q.Route == routeSubmit && q.Code == string(idemgate.CodeKeyReused) && seen && fp == q.FP {
			out["identical retry refused with key_reused (invariant 9)"]++
		}
	}
	for _, a := range h.Actions {
		if a.Outcome == "rejected" {
			out["action rejected with a 4xx: "+a.Detail]++
		}
	}
	return out
}

// outcomeOf names a request's outcome for the summary.
func outcomeOf(q Request) string {
	route := q.Route
	switch {
	case q.Status == 0:
		return route + " transport error"
	case q.Replayed:
		return fmt.Sprintf("%s %d replayed", route, q.Status)
	case q.Code != "":
		return fmt.Sprintf("%s %d %s", route, q.Status, q.Code)
	}
	return fmt.Sprintf("%s %d", route, q.Status)
}

// report prints the summary and returns the exit code.
func report(w io.Writer, h History, asJSON bool) int {
	s := summarize(h)
	code := 0
	if !s.Holds {
		code = 1
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(s)
		return code
	}
	plant := s.Plant
	if plant == "" {
		plant = "none"
	}
	store := s.Store
	if store == "" {
		store = "redis"
	}
	fmt.Fprintf(w, "chaos: seed %d, %s of faults, plant %s, records in %s, policy %s, %s\n\n", s.Seed, s.Duration, plant, store, formatPolicy(h.Meta.Policy), s.Modes)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	table(tw, "faults injected", s.Faults)
	table(tw, "requests by outcome", s.Requests)
	table(tw, "client actions by outcome", s.Actions)
	table(tw, "tasks by final state", s.Tasks)
	fmt.Fprintf(tw, "generator calls, from the %s\t%d\n", s.CallsFrom, s.GenCalls)
	fmt.Fprintf(tw, "export runs, from the export ledger\t%d\n\n", s.Exports)
	if len(s.Notes) > 0 {
		table(tw, "notes (no invariant broken)", s.Notes)
	}
	fmt.Fprintf(tw, "invariant\tverdict\n")
	for _, r := range s.Invariants {
		verdict := "holds"
		if !r.Holds {
			verdict = fmt.Sprintf("VIOLATED (%d)", r.Violations)
		}
		fmt.Fprintf(tw, "%d. %s\t%s\n", r.N, r.Name, verdict)
	}
	tw.Flush()
	for _, r := range s.Invariants {
		for _, e := range r.Examples {
			fmt.Fprintf(w, "  invariant %d: %s\n", r.N, e)
		}
	}
	if s.Holds {
		fmt.Fprintln(w, "\nevery invariant holds")
	} else {
		fmt.Fprintln(w, "\nINVARIANTS VIOLATED")
	}
	return code
}

func table(w io.Writer, title string, m map[string]int) {
	fmt.Fprintf(w, "%s\tcount\n", title)
	keys := make([]string, 0, len(m))
	total := 0
	for k, n := range m {
		keys = append(keys, k)
		total += n
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  %s\t%d\n", k, m[k])
	}
	fmt.Fprintf(w, "  (total)\t%d\n\n", total)
}
