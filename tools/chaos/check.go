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
	1:  "one task per (tenant, user, key, kind); a key never maps to two ids",
	2:  "no false replay: a 2xx answers only the parameters that were sent",
	3:  "no cross-tenant or cross-user answer or effect",
	4:  "every 202 ends terminal or uncertain; no task lost; successes have real images",
	5:  "generator calls: 1 per task unless an attempt was cut off (never under uncertain)",
	6:  "liveness: every client action finishes within the bound after healing",
	7:  "a handler that produced its answer in full runs once per key",
	8:  "what clients were told holds: states only move forward, an end state a client saw is the task's end, only its owner cancels or recovers it",
	9:  "no false conflicts: a first try, or an honest retry with the same parameters, never gets key_reused",
	10: "all 2xx answers under one key are the same answer (one ledger row for an export; one task for a submit: invariant 1)",
	11: "a 200 for /v1/tasks/{id}/export names a ledger row of that task",
	12: "generator calls running at once never exceed MaxRunning / MaxRunningPerTenant; none starts while paused",
	13: "while one tenant floods, another tenant's task starts soon (fair claiming)",
}

// Statuses a task may end a run in (invariant 4).
var endStates = map[string]bool{"succeeded": true, "failed": true, "cancelled": true, "uncertain": true}

// Check runs the invariants over h. It is a pure function of the history.
func Check(h History) []Result {
	c := newChecker(h)
	return []Result{c.one(), c.two(), c.three(), c.four(), c.five(), c.six(), c.seven(), c.eight(),
		c.nine(), c.ten(), c.eleven(), c.twelve(), c.thirteen()}
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

// three: a 2xx that names a task (submit, poll, cancel, export, recover)
// names one of the requester's own tasks; a request on another identity's
// task (poll, cancel, export, recover) finds nothing there: 404, or an
// unavailable store's 5xx, or the caller's own 429 rate_limited, never a
// 2xx or another 4xx that says the task exists; and no export is charged for another identity's task.
func (c *checker) three() Result {
	r := result(3)
	for _, q := range c.h.Requests {
		id, ok := identityOf(q.Tenant, q.User)
		if !ok {
			continue
		}
		if ok2xx(q) && q.TaskID != "" {
			if w, found := c.rows[q.TaskID]; found && (w.Tenant != id.tenant || w.Owner != id.owner) {
				r.violate("%s by tenant %q user %q answered %d with task %s of tenant %q owner %s",
					q.Route, q.Tenant, q.User, q.Status, q.TaskID, w.Tenant, short(w.Owner))
				continue
			}
		}
		w, found := c.rows[q.PathTask]
		if !found || (w.Tenant == id.tenant && w.Owner == id.owner) {
			continue
		}
		if q.Status == 0 || q.Status == 404 || q.Status >= 500 {
			continue
		}
		if q.Status == 429 && q.Code == "rate_limited" {
			// The caller's own tenant's limit answered before the
			// route looked at the task: it says nothing of the task.
			continue
		}
		r.violate("%s by tenant %q user %q on task %s of tenant %q owner %s answered %d %s: another identity's task must look absent (404)",
			q.Route, q.Tenant, q.User, q.PathTask, w.Tenant, short(w.Owner), q.Status, q.Code)
	}
	for _, e := range c.h.Exports {
		if w, found := c.rows[e.TaskID]; found && (w.Tenant != e.Tenant || w.Owner != e.Owner) {
			r.violate("export ledger row %d charges tenant %q owner %s for task %s of tenant %q owner %s",
				e.ID, e.Tenant, short(e.Owner), e.TaskID, w.Tenant, short(w.Owner))
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
			if i <= w.Recoveries {
				// Its owner recovered it: a recovery resumes after the
				// partial results with a call of its own.
				continue
			}
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

// redisKinds are the faults that only Redis suffers: the workers do not
// use it, so these cut off no generator call.
var redisKinds = map[string]bool{"redis-restart": true, "flushall": true}

// isWorker reports whether the process called name is a worker process
// (the tool names them worker0, worker1): the only processes that call
// the generator, since the API nodes run no workers.
func isWorker(name string) bool { return strings.HasPrefix(name, "worker") }

// cutOff reports whether a fault could have cut off one of the earlier
// calls before the call at to: one on the caller's process, or on every
// worker (a Postgres restart), active after the call began. A call
// counted at its end began before it was seen, so for it the window opens
// at the task's creation. When the call log does not name the caller,
// a fault on any worker process counts, never one on an API node.
func (c *checker) cutOff(earlier []GenCall, created, to time.Time) bool {
	for _, f := range c.h.Faults {
		if f.Start.After(to) {
			continue
		}
		for _, g := range earlier {
			from := g.At
			if g.Phase != "start" {
				from = created
			}
			switch {
			case f.End.Before(from):
			case f.Target == "":
				if !redisKinds[f.Kind] {
					return true
				}
			case g.Proc == f.Target, g.Proc == "" && isWorker(f.Target):
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
// back. With the records in Redis, a second row is allowed only when a
// fault can have lost an earlier run's answer: one on that run's API node
// (or a Postgres restart) that began before the answer was stored, or
// Redis losing records (restart, flush) between that run's start and this
// run's start. With the records in Postgres (the route Atomic: the ledger
// row commits with the stored answer) there is no exception. And every
// 200 to an export names a ledger row of the requester's own key.
func (c *checker) seven() Result {
	r := result(7)
	strict := c.h.Meta.Store == "postgres"
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
			switch {
			case strict:
				r.violate("tenant %q owner %s export key %s (task %s): run %d of %d (%s at %s); records in Postgres allow one ledger row per export key, whatever the faults: %s",
					k.tenant, short(k.owner), short(k.key), es[i].TaskID, i+1, len(es), es[i].Proc, es[i].Started.Format(timeFmt), exportList(es))
			case !c.answerLost(es[:i], es[i].Started):
				r.violate("tenant %q owner %s export key %s (task %s): run %d of %d (%s at %s) with no fault on an earlier run's node before its answer was stored, nor Redis lost since: %s",
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

// storeGrace is how long after its ledger row (written just before the
// handler answers) a run's answer is taken to be stored in Redis: the
// handler encodes the answer and the middleware writes it, a few
// milliseconds on an idle machine. A fault that begins later cannot lose
// that answer, unless it is Redis losing its records.
const storeGrace = time.Second

// answerLost reports whether a fault can have lost the stored answer (or
// the claim) of one of the earlier runs before a run that started at
// until: a fault on the run's node, or a Postgres restart, active between
// the run's start and its answer being stored (the ledger insert's reply
// and the completion in Redis are all that can be lost); or Redis
// restarted or flushed between the run's claim and until. The claim comes
// before the handler's start, which is all the ledger says: a Redis fault
// that ended up to storeGrace before the run started may have wiped it.
func (c *checker) answerLost(earlier []Export, until time.Time) bool {
	for _, f := range c.h.Faults {
		if f.Start.After(until) {
			continue
		}
		for _, e := range earlier {
			if redisKinds[f.Kind] && f.Target == "" && !f.End.Before(e.Started.Add(-storeGrace)) {
				return true
			}
			if f.End.Before(e.Started) {
				continue
			}
			beforeStored := !f.Start.After(e.Created.Add(storeGrace))
			switch {
			case f.Target == "" && redisKinds[f.Kind]:
				return true
			case f.Target == "" && beforeStored:
				return true
			case (f.Target == e.Proc || e.Proc == "") && f.Target != "" && beforeStored:
				return true
			}
		}
	}
	return false
}

// eight: what a client was told about a task holds at the end. Answers
// that show a task's state (polls, cancels, recovers, by its owner) never
// go back (pending, then running, retrying or uncertain, then an end
// state), an end state shown is the task's end (failed, until its owner
// recovers it), a cancel answered 200 shows an end state, a task ends
// cancelled only when its owner asked to cancel it, and is recovered only
// when its owner asked. Submits are left out: a replay shows the state
// of its first answer, byte for byte.
func (c *checker) eight() Result {
	r := result(8)
	told := map[string][]Request{}     // by task: the owner's answers that show its state
	recovers := map[string][]Request{} // by task: the owner's recover requests, answered or not
	cancelled := map[string]bool{}     // by task: its owner asked to cancel it
	for _, q := range c.h.Requests {
		id := q.PathTask
		if id == "" {
			id = q.TaskID
		}
		w, found := c.rows[id]
		if !found || q.Route == routeSubmit || q.Route == routeExport || !c.owns(q, w) {
			continue
		}
		switch q.Route {
		case routeCancel:
			cancelled[id] = true
			if ok2xx(q) && stateRank(q.TaskSt) < 2 {
				r.violate("task %s: the cancel answered %d with %s at %s, not an end state", id, q.Status, q.TaskSt, q.Done.Format(timeFmt))
			}
		case routeRecover:
			recovers[id] = append(recovers[id], q)
		}
		if ok2xx(q) && q.TaskSt != "" {
			told[id] = append(told[id], q)
		}
	}
	recoveredBetween := func(id string, from, to time.Time) bool {
		for _, q := range recovers[id] {
			if q.Sent.Before(to) && q.Done.After(from) {
				return true
			}
		}
		return false
	}
	for _, w := range c.h.Rows {
		end := endState(w)
		qs := told[w.ID]
		sort.Slice(qs, func(i, j int) bool { return qs[i].Done.Before(qs[j].Done) })
	answers:
		for i, q := range qs {
			if stateRank(q.TaskSt) == 2 && q.TaskSt != end && !recoveredBetween(w.ID, q.Sent, c.h.Meta.End.Add(time.Hour)) {
				r.violate("task %s: %s told %s at %s, but the task ends %s", w.ID, q.Route, q.TaskSt, q.Done.Format(timeFmt), end)
				break
			}
			for _, p := range qs[:i] {
				if p.Done.Before(q.Sent) && stateRank(q.TaskSt) < stateRank(p.TaskSt) && !recoveredBetween(w.ID, p.Sent, q.Done) {
					r.violate("task %s: told %s at %s, then %s at %s: its state went back", w.ID,
						p.TaskSt, p.Done.Format(timeFmt), q.TaskSt, q.Done.Format(timeFmt))
					break answers
				}
			}
		}
		if w.State == "cancelled" && !cancelled[w.ID] {
			r.violate("task %s ended cancelled, but nobody with the right to cancel it (its owner) asked", w.ID)
		}
		if w.Recoveries > 0 && len(recovers[w.ID]) == 0 {
			r.violate("task %s was recovered %d time(s), but its owner never asked", w.ID, w.Recoveries)
		}
	}
	return r
}

// owns reports whether the requester of q is the owner of w.
func (c *checker) owns(q Request, w Row) bool {
	id, ok := identityOf(q.Tenant, q.User)
	return ok && id.tenant == w.Tenant && id.owner == w.Owner
}

// stateRank orders task states as they may move: pending, then a live or
// uncertain attempt, then an end state.
func stateRank(s string) int {
	switch s {
	case "pending":
		return 0
	case "succeeded", "failed", "cancelled":
		return 2
	}
	return 1
}

// endState is what the API shows of a task's final row: a success with
// no result is shown as failed.
func endState(w Row) string {
	if w.State == "succeeded" && w.Results == 0 {
		return "failed"
	}
	return w.State
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
