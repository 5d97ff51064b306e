package main

import (
	"sort"
	"time"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/keyspace"
)

// limitSlack is how long before an upstream call its claim may have read
// the kind's limits: a claim commits, then the worker logs the call in the
// upstream through its own (maybe slowed) Postgres link.
const limitSlack = 3 * time.Second

// readFrom returns the earliest time the claim of a call that started at
// start can have read the kind's limits: limitSlack before it, and
// limitSlack before any fault that held its worker (or every worker)
// within that window, since a worker stopped, or whose link was cut or
// slowed, between its claim and its call starts the call late. Redis's
// faults do not touch the workers.
func (c *checker) readFrom(proc string, start time.Time) time.Time {
	from := start.Add(-limitSlack)
	for moved := true; moved; {
		moved = false
		for _, f := range c.h.Faults {
			held := f.Target == "" && !redisKinds[f.Kind] || f.Target == proc || proc == "" && isWorker(f.Target)
			if !held || f.Start.After(start) || f.End.Before(from) {
				continue
			}
			if early := f.Start.Add(-limitSlack); early.Before(from) {
				from, moved = early, true
			}
		}
	}
	return from
}

// fairOvertakes is how many of the flooding tenant's tasks, waiting when
// another tenant's task was submitted, may start before it. Claims serve
// the tenants with waiting work in turn, and a task's turn comes after
// its tenant's other waiting tasks (up to 8 clients a tenant here), so a
// few flood tasks go first; without turns the whole burst (30) does.
const fairOvertakes = 12

// nine: no false conflicts. A key's first request is what its client
// meant; a request under the same key with the same parameters (a submit
// with the first one's parameters, an export of the same task) is an
// honest retry and never gets key_reused.
func (c *checker) nine() Result {
	r := result(9)
	type clientKey struct{ route, tenant, user, key string }
	first := map[clientKey]Request{}
	reqs := append([]Request(nil), c.h.Requests...)
	sort.SliceStable(reqs, func(i, j int) bool { return reqs[i].Sent.Before(reqs[j].Sent) })
	for _, q := range reqs {
		if (q.Route != routeSubmit && q.Route != routeExport) || q.Key == "" {
			continue
		}
		k := clientKey{q.Route, q.Tenant, q.User, q.Key}
		f, seen := first[k]
		if !seen {
			first[k] = q
			f = q
		}
		if q.Code != string(idemgate.CodeKeyReused) {
			continue
		}
		switch {
		case q.Route == routeSubmit && q.FP == f.FP:
			r.violate("%s: %s with the parameters of the key's first request (prompt %q) answered %d key_reused",
				keyName(q), map[bool]string{true: "the first try", false: "an honest retry"}[q.Sent.Equal(f.Sent)], promptOf(q), q.Status)
		case q.Route == routeExport && q.PathTask == f.PathTask:
			r.violate("%s: an export of task %s, the key's own, answered %d key_reused", keyName(q), q.PathTask, q.Status)
		}
	}
	return r
}

// ten: all 2xx answers under one key are the same answer. For a submit
// that is one task (invariant 1 checks it); for an export, one ledger row
// of the key (with the records in Redis, a second row only where
// invariant 7 allows a second run; a row of another key or none is
// invariant 7's).
func (c *checker) ten() Result {
	r := result(10)
	type clientKey struct{ route, tenant, user, key string }
	answers := map[clientKey][]Request{}
	byID := map[int64]Export{}
	for _, e := range c.h.Exports {
		byID[e.ID] = e
	}
	for _, q := range c.h.Requests {
		if q.Route != routeExport || !ok2xx(q) {
			continue
		}
		e, found := byID[q.ExportID]
		if !found {
			continue
		}
		if dk, err := keyspace.Derive(exportKind, keyspace.Scope{Tenant: q.Tenant, User: q.User, Request: q.Key}); err != nil || dk.Task() != e.IdemKey {
			continue
		}
		k := clientKey{q.Route, q.Tenant, q.User, q.Key}
		answers[k] = append(answers[k], q)
	}
	for _, k := range sortedKeys(answers) {
		qs := answers[k]
		sort.Slice(qs, func(i, j int) bool { return qs[i].Done.Before(qs[j].Done) })
		for _, q := range qs[1:] {
			f := qs[0]
			switch {
			case q.ExportID != f.ExportID:
				e0, ok0 := byID[f.ExportID]
				e1, ok1 := byID[q.ExportID]
				if c.h.Meta.Store != "postgres" && ok0 && ok1 && c.answerLost([]Export{e0}, e1.Started) {
					continue
				}
				r.violate("%s: export answered %d with ledger row %d, earlier with row %d", keyName(q), q.Status, q.ExportID, f.ExportID)
			default:
				continue
			}
			break
		}
	}
	return r
}

// eleven: a 200 to POST /v1/tasks/{id}/export names a ledger row of the
// task {id}: never the export of another task under a reused key.
func (c *checker) eleven() Result {
	r := result(11)
	byID := map[int64]Export{}
	for _, e := range c.h.Exports {
		byID[e.ID] = e
	}
	for _, q := range c.h.Requests {
		if q.Route != routeExport || !ok2xx(q) || q.PathTask == "" {
			continue
		}
		if e, found := byID[q.ExportID]; found && e.TaskID != q.PathTask {
			r.violate("%s: export of task %s answered %d with ledger row %d, an export of task %s", keyName(q), q.PathTask, q.Status, q.ExportID, e.TaskID)
		}
	}
	return r
}

// genSpan is a generator call with its span: from the upstream's log of it
// to the first of its planned end, its caller's log line that ends it,
// and a kill or pause of its caller (a frozen or dead worker generates
// nothing).
type genSpan struct {
	task, proc, tenant string
	start, end         time.Time
}

// calls returns the generator calls of the upstream's log with their
// spans, in order of start.
func (c *checker) calls() []genSpan {
	ends := map[string][]GenCall{} // by task
	for _, g := range c.h.Gen {
		if g.Phase == "end" {
			ends[g.Task] = append(ends[g.Task], g)
		}
	}
	var out []genSpan
	for _, g := range c.h.Gen {
		if g.Phase != "start" {
			continue
		}
		w, found := c.rows[g.Task]
		if !found {
			continue
		}
		end := g.Done
		if end.IsZero() || end.Before(g.At) {
			end = g.At.Add(time.Hour)
		}
		for _, e := range ends[g.Task] {
			if (g.Proc == "" || e.Proc == g.Proc) && !e.At.Before(g.At) && e.At.Before(end) {
				end = e.At
			}
		}
		for _, f := range c.h.Faults {
			if (f.Kind == "kill" || f.Kind == "pause") && f.Target != "" && (f.Target == g.Proc || g.Proc == "" && isWorker(f.Target)) &&
				!f.Start.Before(g.At) && f.Start.Before(end) {
				end = f.Start
			}
		}
		out = append(out, genSpan{task: g.Task, proc: g.Proc, tenant: w.Tenant, start: g.At, end: end})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start.Before(out[j].start) })
	return out
}

// twelve: generator calls running at once never exceed the kind's
// MaxRunning, nor one tenant's MaxRunningPerTenant, and none starts while
// the kind is paused: at each call's start, against the loosest limits
// that can have been in force when its claim read them.
func (c *checker) twelve() Result {
	r := result(12)
	if len(c.h.Limits) == 0 {
		return r
	}
	limits := append([]Limit(nil), c.h.Limits...)
	sort.Slice(limits, func(i, j int) bool { return limits[i].Asked.Before(limits[j].Asked) })
	calls := c.calls()
	for i, cl := range calls {
		maxRun, perTenant, paused := c.loosest(limits, c.readFrom(cl.proc, cl.start), cl.start)
		if paused {
			r.violate("task %s: a generator call (%s) started at %s while the kind was paused", cl.task, procName(GenCall{Proc: cl.proc}), cl.start.Format(timeFmt))
			continue
		}
		running, mine := 0, 0
		for _, o := range calls[:i+1] {
			if o.end.After(cl.start) {
				running++
				if o.tenant == cl.tenant {
					mine++
				}
			}
		}
		switch {
		case maxRun > 0 && running > maxRun:
			r.violate("task %s: its generator call started at %s with %d calls running, MaxRunning %d", cl.task, cl.start.Format(timeFmt), running, maxRun)
		case perTenant > 0 && mine > perTenant:
			r.violate("task %s: its generator call started at %s with %d calls of tenant %q running, MaxRunningPerTenant %d", cl.task, cl.start.Format(timeFmt), mine, cl.tenant, perTenant)
		}
	}
	return r
}

// loosest returns the loosest limits that can have been in force at some
// time in [from, to] (0: no limit): the last set before from, and every
// change asked before to and not known set before from. paused is true
// only when every one of them was paused.
func (c *checker) loosest(limits []Limit, from, to time.Time) (maxRun, perTenant int, paused bool) {
	var cands []Limit
	base := Limit{} // before any change: no limits
	for _, l := range limits {
		switch {
		case l.Err == "" && !l.Set.After(from):
			base = l
			cands = cands[:0]
		case l.Asked.Before(to):
			cands = append(cands, l)
		}
	}
	cands = append(cands, base)
	paused = true
	noMax, noPer := false, false
	for _, l := range cands {
		paused = paused && l.Paused
		noMax = noMax || l.MaxRunning == 0
		noPer = noPer || l.PerTenant == 0
		maxRun, perTenant = max(maxRun, l.MaxRunning), max(perTenant, l.PerTenant)
	}
	if noMax {
		maxRun = 0
	}
	if noPer {
		perTenant = 0
	}
	return maxRun, perTenant, paused
}

// thirteen: while one tenant floods, another tenant's task starts soon: it
// is overtaken by at most fairOvertakes of the flood's waiting tasks, or
// starts within fairWait(genTime) of its submit (time the kind was paused
// or a fault stopped every worker not counted).
func (c *checker) thirteen() Result {
	r := result(13)
	if c.h.Meta.Flood == "" {
		return r
	}
	flood, ok := identityOf(c.h.Meta.Flood, "flooder")
	if !ok {
		return r
	}
	firstStart := map[string]time.Time{}
	calls := map[string]int{}
	for _, g := range c.h.Gen {
		if g.Phase == "start" {
			calls[g.Task]++
			if t, seen := firstStart[g.Task]; !seen || g.At.Before(t) {
				firstStart[g.Task] = g.At
			}
		}
	}
	var floods []Row
	for _, w := range c.h.Rows {
		if w.Tenant == flood.tenant {
			floods = append(floods, w)
		}
	}
	bound := 5*time.Second + 3*max(c.h.Meta.GenTime, time.Second)
	for _, w := range c.h.Rows {
		s, started := firstStart[w.ID]
		// A task claimed more often than it called the upstream was
		// claimed before its first call (an attempt that never reached
		// the upstream is retried after a backoff, keeping its turn): its
		// first call says nothing of when its turn came.
		if w.Tenant == flood.tenant || !started || w.Attempt > calls[w.ID] {
			continue
		}
		overtakes := 0
		for _, f := range floods {
			fs, ok := firstStart[f.ID]
			if ok && !f.CreatedAt.After(w.CreatedAt) && fs.After(w.CreatedAt) && fs.Before(s) {
				overtakes++
			}
		}
		wait := s.Sub(w.CreatedAt) - c.stopped(w.CreatedAt, s)
		if overtakes > fairOvertakes && wait > bound {
			r.violate("task %s of tenant %q: started %v after its submit (%v not counting pauses and faults), after %d of the flooding tenant's earlier tasks",
				w.ID, w.Tenant, s.Sub(w.CreatedAt).Round(time.Millisecond), wait.Round(time.Millisecond), overtakes)
		}
	}
	return r
}

// stopped is how much of [from, to] the kind was paused or a fault that
// can stop every claim (a Postgres restart, any fault on a worker) lasted.
func (c *checker) stopped(from, to time.Time) time.Duration {
	type span struct{ a, b time.Time }
	var spans []span
	limits := append([]Limit(nil), c.h.Limits...)
	sort.Slice(limits, func(i, j int) bool { return limits[i].Asked.Before(limits[j].Asked) })
	for i, l := range limits {
		if l.Paused {
			end := to
			if i+1 < len(limits) {
				end = limits[i+1].Set
			}
			spans = append(spans, span{l.Asked, end})
		}
	}
	for _, f := range c.h.Faults {
		if f.Kind == "pg-restart" || isWorker(f.Target) {
			spans = append(spans, span{f.Start, f.End.Add(time.Second)})
		}
	}
	var total time.Duration
	for _, sp := range spans {
		a, b := maxTime(sp.a, from), minTime(sp.b, to)
		if b.After(a) {
			total += b.Sub(a)
		}
	}
	return total
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
