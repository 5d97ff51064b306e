package main

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/idemgate/idemgate/keyspace"
)

// Result is one invariant's verdict.
type Result struct {
	N          int      `json:"n"`
	Name       string   `json:"name"`
	Holds      bool     `json:"holds"`
	Violations int      `json:"violations"`
	Examples   []string `json:"examples,omitempty"`
}

// maxExamples bounds the counterexamples kept per invariant.
const maxExamples = 5

func (r *Result) violate(format string, args ...any) {
	r.Holds = false
	r.Violations++
	if len(r.Examples) < maxExamples {
		r.Examples = append(r.Examples, fmt.Sprintf(format, args...))
	}
}

// Invariant names, in the order.
var invariantNames = [...]string{
	1: "one task per (tenant, user, key, kind); a key never maps to two ids",
	2: "no false replay: a 2xx answers only the parameters that were sent",
	3: "no cross-tenant or cross-user answer",
	4: "every 202 ends terminal or uncertain; no task lost; successes have real images",
	5: "generator calls: 1 per task unless an attempt was cut off (never under uncertain)",
	6: "liveness: every client action finishes within the bound after healing",
	7: "a handler that produced its answer in full runs once per key",
}

// Statuses a task may end a run in (invariant 4).
var endStates = map[string]bool{"succeeded": true, "failed": true, "cancelled": true, "uncertain": true}

// Check runs the invariants over h. It is a pure function of the history.
func Check(h History) []Result {
	c := newChecker(h)
	return []Result{c.one(), c.two(), c.three(), c.four(), c.five(), c.six(), c.seven()}
}

// Holds reports whether every invariant holds.
func Holds(rs []Result) bool {
	for _, r := range rs {
		if !r.Holds {
			return false
		}
	}
	return true
}

type checker struct {
	h    History
	rows map[string]Row // by task id
}

func newChecker(h History) *checker {
	c := &checker{h: h, rows: map[string]Row{}}
	for _, r := range h.Rows {
		c.rows[r.ID] = r
	}
	return c
}

func result(n int) Result { return Result{N: n, Name: invariantNames[n], Holds: true} }

// identity is what a requester's tasks are stored under.
type identity struct{ tenant, owner string }

// identityOf derives the stored tenant segment and owner of a requester.
func identityOf(tenant, user string) (identity, bool) {
	k, err := keyspace.Derive("images", keyspace.Scope{Tenant: tenant, User: user, Request: "-"})
	if err != nil {
		return identity{}, false
	}
	return identity{k.Tenant(), k.Owner()}, true
}

// keyName names a client key for a counterexample.
func keyName(q Request) string {
	return fmt.Sprintf("tenant %q user %q key %q", q.Tenant, q.User, q.Key)
}

func isSubmit(q Request) bool { return q.Route == routeSubmit }

func ok2xx(q Request) bool { return q.Status/100 == 2 }

// one: one row per (tenant, owner, kind, key); one task id per client key.
func (c *checker) one() Result {
	r := result(1)
	type rowKey struct{ tenant, owner, kind, key string }
	byKey := map[rowKey][]string{}
	for _, w := range c.h.Rows {
		k := rowKey{w.Tenant, w.Owner, w.Kind, w.IdemKey}
		byKey[k] = append(byKey[k], w.ID)
	}
	for _, k := range sortedKeys(byKey) {
		if ids := byKey[k]; len(ids) > 1 {
			r.violate("tenant %q kind %s key %s: %d task rows %v", k.tenant, k.kind, short(k.key), len(ids), ids)
		}
	}
	type clientKey struct{ tenant, user, key string }
	ids := map[clientKey]map[string]bool{}
	for _, q := range c.h.Requests {
		if !isSubmit(q) || !ok2xx(q) || q.TaskID == "" {
			continue
		}
		k := clientKey{q.Tenant, q.User, q.Key}
		if ids[k] == nil {
			ids[k] = map[string]bool{}
		}
		ids[k][q.TaskID] = true
		// The row the answer names must be the key's own row.
		if w, found := c.rows[q.TaskID]; found {
			dk, err := keyspace.Derive(w.Kind, keyspace.Scope{Tenant: q.Tenant, User: q.User, Request: q.Key})
			if err == nil && dk.Task() != w.IdemKey {
				r.violate("%s: answered with task %s, the row of another key", keyName(q), q.TaskID)
			}
		}
	}
	for _, k := range sortedKeys(ids) {
		if set := ids[k]; len(set) > 1 {
			r.violate("tenant %q user %q key %q: answered with %d task ids %v", k.tenant, k.user, k.key, len(set), sortedKeys(set))
		}
	}
	return r
}

// two: every 2xx to a submit names a task whose parameters are those sent,
// and the 2xx answers under one key were all sent the same parameters.
func (c *checker) two() Result {
	r := result(2)
	type clientKey struct{ tenant, user, key string }
	first := map[clientKey]Request{}
	for _, q := range c.h.Requests {
		if !isSubmit(q) || !ok2xx(q) {
			continue
		}
		if w, found := c.rows[q.TaskID]; found && w.ParamsFP != q.FP {
			r.violate("%s: sent params %s (prompt %q) but got 2xx (replayed=%v) with task %s of params %s",
				keyName(q), q.FP, promptOf(q), q.Replayed, q.TaskID, w.ParamsFP)
			continue
		}
		k := clientKey{q.Tenant, q.User, q.Key}
		f, seen := first[k]
		if !seen {
			first[k] = q
			continue
		}
		if f.FP != q.FP {
			r.violate("%s: drifted retry got %d (replayed=%v, task %s): sent params %s (prompt %q), first 2xx was for %s (prompt %q)",
				keyName(q), q.Status, q.Replayed, q.TaskID, q.FP, promptOf(q), f.FP, promptOf(f))
		}
	}
	return r
}

func promptOf(q Request) string {
	if q.Params == nil {
		return ""
	}
	return q.Params.Prompt
}

// three: a 2xx that names a task (submit, poll, cancel) names one of the
// requester's own tasks.
func (c *checker) three() Result {
	r := result(3)
	for _, q := range c.h.Requests {
		if !ok2xx(q) || q.TaskID == "" {
			continue
		}
		w, found := c.rows[q.TaskID]
		if !found {
			continue // invariant 4's business
		}
		id, ok := identityOf(q.Tenant, q.User)
		if !ok {
			continue
		}
		if w.Tenant != id.tenant || w.Owner != id.owner {
			r.violate("%s by tenant %q user %q answered %d with task %s of tenant %q owner %s",
				q.Route, q.Tenant, q.User, q.Status, q.TaskID, w.Tenant, short(w.Owner))
		}
	}
	return r
}

// four: every accepted task is in the table, in an end state; successes
// carry real images, in the table and in every answer.
func (c *checker) four() Result {
	r := result(4)
	accepted := map[string]Request{}
	for _, q := range c.h.Requests {
		if isSubmit(q) && ok2xx(q) && q.TaskID != "" {
			if _, seen := accepted[q.TaskID]; !seen {
				accepted[q.TaskID] = q
			}
		}
		if q.BadImages > 0 || (q.TaskSt == "succeeded" && q.Route == routeTask && ok2xx(q) && q.Images == 0) {
			r.violate("%s task %s answered succeeded with %d images, %d not PNG", q.Route, q.TaskID, q.Images, q.BadImages)
		}
	}
	for _, id := range sortedKeys(accepted) {
		w, found := c.rows[id]
		switch {
		case !found:
			r.violate("lost task: %s was accepted as task %s, which is not in the table", keyName(accepted[id]), id)
		case !endStates[w.State]:
			r.violate("task %s ended the run %s (attempt %d), not terminal or uncertain", id, w.State, w.Attempt)
		}
	}
	for _, w := range c.h.Rows {
		if w.State == "succeeded" && (w.Results == 0 || w.PNGs != w.Results) {
			r.violate("task %s succeeded with %d results, %d of them PNG images", w.ID, w.Results, w.PNGs)
		}
	}
	return r
}

// five: generator calls per task. A task whose attempts were never cut off
// (one claim, finished by its generator call) has exactly one call. More
// than one call is allowed only under the "retry" policy, and each extra
// call only when a fault hit the process of an earlier call (or everyone)
// between the task's creation and the extra call.
func (c *checker) five() Result {
	r := result(5)
	calls := map[string][]GenCall{}
	reconciled := map[string]bool{}
	phase := "end"
	if c.h.Meta.Starts {
		phase = "start"
	}
	for _, g := range c.h.Gen {
		switch g.Phase {
		case phase:
			calls[g.Task] = append(calls[g.Task], g)
		case "reconcile":
			reconciled[g.Task] = true
		}
	}
	for _, w := range c.h.Rows {
		cs := calls[w.ID]
		sort.Slice(cs, func(i, j int) bool { return cs[i].At.Before(cs[j].At) })
		if w.Attempt == 1 && (w.State == "succeeded" || w.State == "failed") && !reconciled[w.ID] && len(cs) != 1 {
			r.violate("task %s: %s after one attempt with %d generator calls, want exactly 1", w.ID, w.State, len(cs))
			continue
		}
		if len(cs) <= 1 {
			continue
		}
		policy := c.h.Meta.Policy[w.Kind]
		for i := 1; i < len(cs); i++ {
			if policy != "retry" {
				r.violate("task %s: generator call %d of %d (%s at %s) under the %q policy: %s",
					w.ID, i+1, len(cs), procName(cs[i]), cs[i].At.Format(timeFmt), policyName(policy), callList(cs))
				continue
			}
			if !c.cutOff(cs[:i], w.CreatedAt, cs[i].At) {
				r.violate("task %s: generator call %d of %d (%s at %s) with no fault on an earlier call's process: %s",
					w.ID, i+1, len(cs), procName(cs[i]), cs[i].At.Format(timeFmt), callList(cs))
			}
		}
	}
	return r
}

func policyName(p string) string {
	if p == "" {
		return "uncertain"
	}
	return p
}

// cutOff reports whether a fault could have cut off one of the earlier
// calls: one on its process (any process, when the call log does not say
// which) or on every process, active at some time in [from, to].
func (c *checker) cutOff(earlier []GenCall, from, to time.Time) bool {
	for _, f := range c.h.Faults {
		if f.End.Before(from) || f.Start.After(to) {
			continue
		}
		if f.Target == "" {
			return true
		}
		for _, g := range earlier {
			if g.Proc == f.Target || g.Proc == "" {
				return true
			}
		}
	}
	return false
}

func callList(cs []GenCall) string {
	parts := make([]string, len(cs))
	for i, g := range cs {
		what := g.Result
		if what == "" {
			what = g.Phase
		}
		parts[i] = fmt.Sprintf("%s@%s:%s", procName(g), g.At.Format(timeFmt), what)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

const timeFmt = "15:04:05.000"

// procName names the process of a call; the upstream's log does not say.
func procName(g GenCall) string {
	if g.Proc == "" {
		return "a worker"
	}
	return g.Proc
}

// six: every action finished, and none after Heal + Bound.
func (c *checker) six() Result {
	r := result(6)
	deadline := c.h.Meta.Heal.Add(c.h.Meta.Bound)
	for _, a := range c.h.Actions {
		switch {
		case a.Outcome == "unfinished":
			r.violate("client %d action %d (%s, key %q, task %s) unfinished %v after healing: %s",
				a.Client, a.ID, a.Scenario, a.Key, a.TaskID, c.h.Meta.Bound, a.Detail)
		case !c.h.Meta.Heal.IsZero() && a.End.After(deadline):
			r.violate("client %d action %d (%s, key %q) finished %v after healing, past the %v bound",
				a.Client, a.ID, a.Scenario, a.Key, a.End.Sub(c.h.Meta.Heal).Round(time.Millisecond), c.h.Meta.Bound)
		}
	}
	return r
}

// seven: the export route's handler records each run in a ledger before
// it answers, so a ledger row is a handler run that produced its answer in
// full. Per (tenant, owner, key) there is one row: the middleware stores
// the answer, also when the client left mid-run, and a retry gets it
// back. A second row is allowed only when a fault can have lost the first
// run's answer or claim: one on the API node of an earlier run, or on
// every process (Redis restarted or flushed, Postgres restarted), active
// between the first run's start and this run's start. And every 200 to an
// export names a ledger row of the requester's own key.
func (c *checker) seven() Result {
	r := result(7)
	type ledgerKey struct{ tenant, owner, key string }
	runs := map[ledgerKey][]Export{}
	byID := map[int64]Export{}
	for _, e := range c.h.Exports {
		k := ledgerKey{e.Tenant, e.Owner, e.IdemKey}
		runs[k] = append(runs[k], e)
		byID[e.ID] = e
	}
	for _, k := range sortedKeys(runs) {
		es := runs[k]
		sort.Slice(es, func(i, j int) bool { return es[i].Started.Before(es[j].Started) })
		for i := 1; i < len(es); i++ {
			if !c.faultOn(es[:i], es[0].Started, es[i].Started) {
				r.violate("tenant %q owner %s export key %s (task %s): run %d of %d (%s at %s) with no fault on an earlier run's node: %s",
					k.tenant, short(k.owner), short(k.key), es[i].TaskID, i+1, len(es), es[i].Proc, es[i].Started.Format(timeFmt), exportList(es))
			}
		}
	}
	for _, q := range c.h.Requests {
		if q.Route != routeExport || !ok2xx(q) {
			continue
		}
		e, found := byID[q.ExportID]
		if !found {
			r.violate("%s: answered %d with export %d, which is not in the ledger", keyName(q), q.Status, q.ExportID)
			continue
		}
		dk, err := keyspace.Derive(exportKind, keyspace.Scope{Tenant: q.Tenant, User: q.User, Request: q.Key})
		if err == nil && (dk.Task() != e.IdemKey || dk.Tenant() != e.Tenant || dk.Owner() != e.Owner) {
			r.violate("%s: answered %d with export %d, the run of another key", keyName(q), q.Status, q.ExportID)
		}
	}
	return r
}

// faultOn reports whether a fault on the node of one of the runs, or on
// every process, was active at some time in [from, to].
func (c *checker) faultOn(runs []Export, from, to time.Time) bool {
	for _, f := range c.h.Faults {
		if f.End.Before(from) || f.Start.After(to) {
			continue
		}
		if f.Target == "" {
			return true
		}
		for _, e := range runs {
			if e.Proc == f.Target || e.Proc == "" {
				return true
			}
		}
	}
	return false
}

func exportList(es []Export) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = fmt.Sprintf("#%d %s@%s", e.ID, e.Proc, e.Started.Format(timeFmt))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// short abbreviates a long digest for a counterexample.
func short(s string) string {
	if len(s) > 16 {
		return s[:16] + "…"
	}
	return s
}

func sortedKeys[K comparable, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return fmt.Sprint(keys[i]) < fmt.Sprint(keys[j]) })
	return keys
}
