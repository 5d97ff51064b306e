package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/keyspace"
)

var t0 = time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// fixture builds histories for the checker tests: a tenant, a user and
// their tasks, the way a run records them.
type fixture struct{ h History }

func newFixture(policy string) *fixture {
	return &fixture{h: History{Meta: Meta{
		Seed: 1, Start: at(0), Heal: at(30), Bound: 20 * time.Second, End: at(40),
		Policy: map[string]string{"images": policy},
	}}}
}

var dogs = Params{Prompt: "a dog", AspectRatio: "1:1", N: 1}

// task adds the row of key for (tenant, user) with params p, in state.
func (f *fixture) task(id, tenant, user, key string, p Params, state string, attempt int) {
	k, err := keyspace.Derive("images", keyspace.Scope{Tenant: tenant, User: user, Request: key})
	if err != nil {
		panic(err)
	}
	w := Row{ID: id, Tenant: k.Tenant(), Owner: k.Owner(), Kind: "images", IdemKey: k.Task(),
		ParamsFP: p.FP(), State: state, Attempt: attempt, CreatedAt: at(1)}
	if state == "succeeded" {
		w.Results, w.PNGs = 1, 1
	}
	f.h.Rows = append(f.h.Rows, w)
}

// submit adds a submit and its answer.
func (f *fixture) submit(tenant, user, key string, p Params, status int, task string, replayed bool) {
	q := Request{Tenant: tenant, User: user, Route: routeSubmit, Key: key, Params: &p, FP: p.FP(),
		Sent: at(2), Done: at(2.1), Status: status, TaskID: task, Replayed: replayed}
	if status == 409 {
		q.Code, q.TaskID = string(idemgate.CodeKeyReused), ""
	}
	f.h.Requests = append(f.h.Requests, q)
}

func (f *fixture) poll(tenant, user, task string, status int, taskStatus string, images, bad int) {
	f.h.Requests = append(f.h.Requests, Request{Tenant: tenant, User: user, Route: routeTask,
		Sent: at(3), Done: at(3.1), Status: status, TaskID: task, TaskSt: taskStatus, Images: images, BadImages: bad})
}

func (f *fixture) gen(task, proc string, s float64) {
	f.h.Gen = append(f.h.Gen, GenCall{Task: task, Proc: proc, Phase: "end", Result: "done", At: at(s)})
}

func (f *fixture) action(key, outcome string, end float64) {
	f.h.Actions = append(f.h.Actions, Action{ID: len(f.h.Actions) + 1, Tenant: "acme", User: "alice",
		Key: key, Scenario: "plain", Start: at(1), End: at(end), Outcome: outcome})
}

// exportRun adds a ledger row: the export handler ran for key on proc,
// starting at s.
func (f *fixture) exportRun(id int64, tenant, user, key, task, proc string, s float64) {
	k, err := keyspace.Derive(exportKind, keyspace.Scope{Tenant: tenant, User: user, Request: key})
	if err != nil {
		panic(err)
	}
	f.h.Exports = append(f.h.Exports, Export{ID: id, Tenant: k.Tenant(), Owner: k.Owner(), IdemKey: k.Task(),
		TaskID: task, Proc: proc, Started: at(s), Created: at(s + 0.3)})
}

// export adds an export request and its answer: status 0 is a client
// that gave up.
func (f *fixture) export(tenant, user, key, task string, status int, exportID int64, replayed bool, s float64) {
	q := Request{Tenant: tenant, User: user, Route: routeExport, Key: key, Sent: at(s), Done: at(s + 0.1),
		Status: status, Replayed: replayed}
	if status == 0 {
		q.Err = "context deadline exceeded"
	} else {
		q.TaskID, q.ExportID, q.Images = task, exportID, 1
	}
	f.h.Requests = append(f.h.Requests, q)
}

// healthy is one accepted action, replayed once, polled to success, then
// exported by a client that gave up mid-export and retried.
func healthy(policy string) *fixture {
	f := newFixture(policy)
	f.task("T1", "acme", "alice", "poster:1", dogs, "succeeded", 1)
	f.submit("acme", "alice", "poster:1", dogs, 202, "T1", false)
	f.submit("acme", "alice", "poster:1", dogs, 202, "T1", true)
	f.poll("acme", "alice", "T1", 200, "succeeded", 1, 0)
	f.gen("T1", "worker0", 4)
	f.action("poster:1", "succeeded", 5)
	f.exportRun(1, "acme", "alice", "export:1", "T1", "api0", 6)
	f.export("acme", "alice", "export:1", "T1", 0, 0, false, 6)
	f.export("acme", "alice", "export:1", "T1", 200, 1, true, 6.5)
	return f
}

// cancel adds the owner's (or anyone's) cancel of task and its answer.
func (f *fixture) cancel(tenant, user, task string, status int, taskStatus string, s float64) {
	q := Request{Tenant: tenant, User: user, Route: routeCancel, PathTask: task,
		Sent: at(s), Done: at(s + 0.1), Status: status}
	if status/100 == 2 {
		q.TaskID, q.TaskSt = task, taskStatus
	} else if status == 404 {
		q.Code = "not_found"
	}
	f.h.Requests = append(f.h.Requests, q)
}

// pollAt adds a poll of task answered at s with its status.
func (f *fixture) pollAt(tenant, user, task string, status int, taskStatus string, images int, s float64) {
	q := Request{Tenant: tenant, User: user, Route: routeTask, PathTask: task,
		Sent: at(s), Done: at(s + 0.1), Status: status, Images: images}
	if status/100 == 2 {
		q.TaskID, q.TaskSt = task, taskStatus
	} else if status == 404 {
		q.Code = "not_found"
	}
	f.h.Requests = append(f.h.Requests, q)
}

// other adds a request by (tenant, user) on route for task, answered
// with status and code: another identity trying a task.
func (f *fixture) other(tenant, user, route, task string, status int, code string, s float64) {
	q := Request{Tenant: tenant, User: user, Route: route, PathTask: task,
		Sent: at(s), Done: at(s + 0.1), Status: status, Code: code}
	if route == routeExport {
		q.Key = "snoop:1"
	}
	if status/100 == 2 {
		q.TaskID = task
	}
	f.h.Requests = append(f.h.Requests, q)
}

// start adds a generator call at its start, as the upstream's call log
// records it; proc is the caller, "" when the log does not say.
func (f *fixture) start(task, proc string, s float64) {
	f.h.Gen = append(f.h.Gen, GenCall{Task: task, Proc: proc, Phase: "start", Result: "ok", At: at(s)})
}

func TestCheck(t *testing.T) {
	t.Parallel()
	cats := Params{Prompt: "a cat", AspectRatio: "1:1", N: 1}
	tests := []struct {
		name  string
		given func() *fixture
		want  map[int]string // invariant → a substring of its first counterexample; absent: holds
	}{
		{name: "a healthy history holds", given: func() *fixture { return healthy("uncertain") }},
		{
			name: "1: two rows for one key",
			given: func() *fixture {
				f := healthy("uncertain")
				f.task("T2", "acme", "alice", "poster:1", dogs, "succeeded", 1)
				f.gen("T2", "worker1", 4)
				return f
			},
			want: map[int]string{1: "2 task rows"},
		},
		{
			name: "1: one key answered with two task ids",
			given: func() *fixture {
				f := healthy("uncertain")
				f.task("T2", "acme", "alice", "poster:2", dogs, "succeeded", 1)
				f.gen("T2", "worker1", 4)
				f.submit("acme", "alice", "poster:1", dogs, 202, "T2", true)
				return f
			},
			want: map[int]string{1: "another key"},
		},
		{
			name: "2: a reworded retry under the old key is replayed",
			given: func() *fixture {
				f := healthy("uncertain")
				f.submit("acme", "alice", "poster:1", cats, 202, "T1", true)
				return f
			},
			want: map[int]string{2: `prompt "a cat"`},
		},
		{
			name: "2: the 409 a reworded retry must get holds",
			given: func() *fixture {
				f := healthy("uncertain")
				f.submit("acme", "alice", "poster:1", cats, 409, "", false)
				return f
			},
		},
		{
			name: "2: drifted parameters accepted as a new task under the old key",
			given: func() *fixture {
				// Both answers name rows with the parameters they sent, but
				// the key got two parameter sets: invariant 1 sees two ids
				// for a key, invariant 2 sees the drifted 2xx.
				f := healthy("uncertain")
				f.task("T2", "acme", "alice", "poster:1b", cats, "succeeded", 1)
				f.h.Rows[1].IdemKey = f.h.Rows[0].IdemKey
				f.h.Rows[1].Tenant = "other" // keep the rows apart for invariant 1's table check
				f.gen("T2", "worker1", 4)
				f.submit("acme", "alice", "poster:1", cats, 202, "T2", false)
				return f
			},
			want: map[int]string{1: "2 task ids", 2: "drifted retry", 3: "tenant \"other\""},
		},
		{
			name: "3: another tenant's task answered to a poll",
			given: func() *fixture {
				f := healthy("uncertain")
				f.task("T9", "globex", "alice", "poster:1", dogs, "succeeded", 1)
				f.gen("T9", "worker1", 4)
				f.poll("acme", "alice", "T9", 200, "succeeded", 1, 0)
				return f
			},
			want: map[int]string{3: "task T9 of tenant \"globex\""},
		},
		{
			name: "3: another user's replay under a shared request id",
			given: func() *fixture {
				f := healthy("uncertain")
				f.submit("acme", "bob", "poster:1", dogs, 202, "T1", true)
				return f
			},
			want: map[int]string{1: "another key", 3: `user "bob"`},
		},
		{
			name: "4: an accepted task is lost",
			given: func() *fixture {
				f := healthy("uncertain")
				f.submit("acme", "alice", "poster:7", dogs, 202, "T7", false)
				return f
			},
			want: map[int]string{4: "lost task"},
		},
		{
			name: "4: a task still pending at the end",
			given: func() *fixture {
				f := healthy("uncertain")
				f.h.Rows[0].State = "pending"
				f.h.Rows[0].Attempt = 0
				f.h.Gen = nil
				f.h.Requests[2].TaskSt, f.h.Requests[2].Images = "pending", 0 // the poll saw it pending
				return f
			},
			want: map[int]string{4: "ended the run pending"},
		},
		{
			name: "4: a success without real images",
			given: func() *fixture {
				f := healthy("uncertain")
				f.h.Rows[0].PNGs = 0
				return f
			},
			want: map[int]string{4: "0 of them PNG"},
		},
		{
			name: "4: a poll answered succeeded with a non-PNG image",
			given: func() *fixture {
				f := healthy("uncertain")
				f.poll("acme", "alice", "T1", 200, "succeeded", 1, 1)
				return f
			},
			want: map[int]string{4: "1 not PNG"},
		},
		{
			name: "5: two generator calls under the uncertain policy",
			given: func() *fixture {
				f := healthy("uncertain")
				f.h.Rows[0].Attempt = 2
				f.gen("T1", "worker1", 4.5)
				f.h.Faults = append(f.h.Faults, Fault{Kind: "pause", Target: "worker0", Start: at(3), End: at(5)})
				return f
			},
			want: map[int]string{5: `under the "uncertain" policy`},
		},
		{
			name: "5: a second call under retry without a fault on the first caller",
			given: func() *fixture {
				f := healthy("retry")
				f.h.Rows[0].Attempt = 2
				f.gen("T1", "worker1", 4.5)
				f.h.Faults = append(f.h.Faults, Fault{Kind: "pause", Target: "worker1", Start: at(3), End: at(5)})
				return f
			},
			want: map[int]string{5: "no fault on an earlier call's process"},
		},
		{
			name: "5: a second call under retry after the first caller was paused holds",
			given: func() *fixture {
				f := healthy("retry")
				f.h.Rows[0].Attempt = 2
				f.gen("T1", "worker1", 4.5)
				f.h.Faults = append(f.h.Faults, Fault{Kind: "pause", Target: "worker0", Start: at(3), End: at(5)})
				return f
			},
		},
		{
			name: "5: a task finished after one attempt without a generator call",
			given: func() *fixture {
				f := healthy("uncertain")
				f.h.Gen = nil
				return f
			},
			want: map[int]string{5: "0 generator calls"},
		},
		{
			name: "5: a reconciled task needs no generator call",
			given: func() *fixture {
				f := healthy("uncertain")
				f.h.Rows[0].Attempt = 2
				f.h.Gen = []GenCall{{Task: "T1", Proc: "worker1", Phase: "reconcile", At: at(6)}}
				return f
			},
		},
		{
			name: "5: counted at their start, a call cut off by a kill still counts",
			given: func() *fixture {
				// A worker started the call and was killed (no end line);
				// the task was handed out again and generated again. The
				// upstream's log does not say which worker called.
				f := healthy("uncertain")
				f.h.Meta.Starts = true
				f.h.Rows[0].Attempt = 2
				f.h.Gen = []GenCall{
					{Task: "T1", Phase: "start", Result: "ok", At: at(2.5)},
					{Task: "T1", Phase: "start", Result: "ok", At: at(34)},
					{Task: "T1", Proc: "worker1", Phase: "end", Result: "done", At: at(35)},
				}
				f.h.Faults = append(f.h.Faults, Fault{Kind: "kill", Target: "worker0", Start: at(3), End: at(4)})
				return f
			},
			want: map[int]string{5: "[a worker@09:00:02.500:ok a worker@09:00:34.000:ok]"},
		},
		{
			name: "5: counted at their start under retry, a worker's kill explains the second call",
			given: func() *fixture {
				f := healthy("retry")
				f.h.Meta.Starts = true
				f.h.Rows[0].Attempt = 2
				f.h.Gen = []GenCall{
					{Task: "T1", Phase: "start", At: at(2.5)},
					{Task: "T1", Phase: "start", At: at(34)},
				}
				f.h.Faults = append(f.h.Faults, Fault{Kind: "kill", Target: "worker0", Start: at(3), End: at(4)})
				return f
			},
		},
		{
			name: "5: counted at their start under retry, no fault explains the second call",
			given: func() *fixture {
				f := healthy("retry")
				f.h.Meta.Starts = true
				f.h.Rows[0].Attempt = 2
				f.h.Gen = []GenCall{
					{Task: "T1", Phase: "start", At: at(2.5)},
					{Task: "T1", Phase: "start", At: at(34)},
				}
				f.h.Faults = append(f.h.Faults, Fault{Kind: "kill", Target: "worker0", Start: at(40), End: at(41)})
				return f
			},
			want: map[int]string{5: "no fault on an earlier call's process"},
		},
		{
			name: "6: an action unfinished at the deadline",
			given: func() *fixture {
				f := healthy("uncertain")
				f.action("poster:3", "unfinished", 50)
				return f
			},
			want: map[int]string{6: "unfinished"},
		},
		{
			name: "6: an action finished past the bound",
			given: func() *fixture {
				f := healthy("uncertain")
				f.action("poster:3", "succeeded", 51)
				return f
			},
			want: map[int]string{6: "past the 20s bound"},
		},
		{
			name: "7: an export run again for one key with no fault",
			given: func() *fixture {
				f := healthy("uncertain")
				f.exportRun(2, "acme", "alice", "export:1", "T1", "api1", 6.5)
				return f
			},
			want: map[int]string{7: "run 2 of 2 (api1"},
		},
		{
			name: "7: an export run again after its node was paused holds",
			given: func() *fixture {
				f := healthy("uncertain")
				f.exportRun(2, "acme", "alice", "export:1", "T1", "api1", 9)
				f.h.Faults = append(f.h.Faults, Fault{Kind: "pause", Target: "api0", Start: at(6.1), End: at(8)})
				return f
			},
		},
		{
			name: "7: an export run again after Redis was flushed holds",
			given: func() *fixture {
				f := healthy("uncertain")
				f.exportRun(2, "acme", "alice", "export:1", "T1", "api0", 20)
				f.h.Faults = append(f.h.Faults, Fault{Kind: "flushall", Start: at(12), End: at(12)})
				return f
			},
		},
		{
			name: "7: a fault on another node explains nothing",
			given: func() *fixture {
				f := healthy("uncertain")
				f.exportRun(2, "acme", "alice", "export:1", "T1", "api0", 9)
				f.h.Faults = append(f.h.Faults, Fault{Kind: "kill", Target: "api1", Start: at(6.1), End: at(7)},
					Fault{Kind: "pause", Target: "api0", Start: at(9.5), End: at(10)})
				return f
			},
			want: map[int]string{7: "no fault on an earlier run's node"},
		},
		{
			name: "7: an export answered with the run of another key",
			given: func() *fixture {
				f := healthy("uncertain")
				f.task("T2", "acme", "bob", "poster:1", dogs, "succeeded", 1)
				f.gen("T2", "worker1", 4)
				f.exportRun(2, "acme", "bob", "export:1", "T2", "api0", 7)
				f.export("acme", "alice", "export:1", "T1", 200, 2, true, 8)
				return f
			},
			want: map[int]string{7: "the run of another key"},
		},
		{
			name: "7: an export answered with a run the ledger does not hold",
			given: func() *fixture {
				f := healthy("uncertain")
				f.export("acme", "alice", "export:1", "T1", 200, 9, true, 8)
				return f
			},
			want: map[int]string{7: "not in the ledger"},
		},
		// What clients were told against how tasks end (invariant 8).
		{
			name: "8: a cancel answered cancelled, then a late outcome made the task succeeded",
			given: func() *fixture {
				f := newFixture("uncertain")
				f.task("T1", "acme", "alice", "poster:1", dogs, "succeeded", 1)
				f.submit("acme", "alice", "poster:1", dogs, 202, "T1", false)
				f.cancel("acme", "alice", "T1", 200, "cancelled", 2.5)
				f.gen("T1", "worker0", 4)
				f.action("poster:1", "cancelled", 5)
				return f
			},
			want: map[int]string{8: "told cancelled"},
		},
		{
			name: "8: a plain action nobody cancelled ends cancelled",
			given: func() *fixture {
				f := newFixture("uncertain")
				f.task("T1", "acme", "alice", "poster:1", dogs, "cancelled", 1)
				f.submit("acme", "alice", "poster:1", dogs, 202, "T1", false)
				f.pollAt("acme", "alice", "T1", 200, "cancelled", 0, 3)
				f.action("poster:1", "cancelled", 5)
				return f
			},
			want: map[int]string{8: "nobody"},
		},
		{
			name: "8: a poll showed succeeded with images, the task ends failed",
			given: func() *fixture {
				f := healthy("uncertain")
				f.h.Rows[0].State, f.h.Rows[0].Results, f.h.Rows[0].PNGs, f.h.Rows[0].Error = "failed", 0, 0, "upstream refused"
				return f
			},
			want: map[int]string{8: "told succeeded"},
		},
		{
			name: "8: a task told running is later told pending",
			given: func() *fixture {
				f := healthy("uncertain")
				f.pollAt("acme", "alice", "T1", 200, "running", 0, 2.2)
				f.pollAt("acme", "alice", "T1", 200, "pending", 0, 2.5)
				return f
			},
			want: map[int]string{8: "went back"},
		},
		{
			name: "8: a cancel answered 200 with a task still running",
			given: func() *fixture {
				f := healthy("uncertain")
				f.cancel("acme", "alice", "T1", 200, "running", 2.5)
				return f
			},
			want: map[int]string{8: "cancel answered 200 with running"},
		},
		{
			name: "8: a task recovered that its owner never asked to recover",
			given: func() *fixture {
				f := healthy("uncertain")
				f.h.Rows[0].Recoveries = 1
				return f
			},
			want: map[int]string{8: "recovered 1 time"},
		},
		{
			name: "8: a cancel that ends the task cancelled holds",
			given: func() *fixture {
				f := newFixture("uncertain")
				f.task("T1", "acme", "alice", "poster:1", dogs, "cancelled", 1)
				f.submit("acme", "alice", "poster:1", dogs, 202, "T1", false)
				f.pollAt("acme", "alice", "T1", 200, "running", 0, 2.2)
				f.cancel("acme", "alice", "T1", 200, "cancelled", 2.5)
				f.pollAt("acme", "alice", "T1", 200, "cancelled", 0, 3)
				f.action("poster:1", "cancelled", 5)
				return f
			},
		},
		{
			name: "8: a cancel too late, answered with the success it cannot undo, holds",
			given: func() *fixture {
				f := healthy("uncertain")
				f.cancel("acme", "alice", "T1", 200, "succeeded", 4.5)
				return f
			},
		},
		{
			name: "8: a success with no real result is told failed, and holds",
			given: func() *fixture {
				f := newFixture("uncertain")
				f.task("T1", "acme", "alice", "poster:1", dogs, "succeeded", 1)
				f.h.Rows[0].Results, f.h.Rows[0].PNGs = 0, 0
				f.submit("acme", "alice", "poster:1", dogs, 202, "T1", false)
				f.pollAt("acme", "alice", "T1", 200, "failed", 0, 3)
				f.gen("T1", "worker0", 2.9)
				f.action("poster:1", "failed", 5)
				return f
			},
			want: map[int]string{4: "succeeded with 0 results"},
		},
		// Invariant 7 excuses only what can lose the first answer.
		{
			name: "7: a Postgres restart after the first answer was stored explains nothing",
			given: func() *fixture {
				f := healthy("uncertain")
				f.exportRun(2, "acme", "alice", "export:1", "T1", "api1", 9)
				f.h.Faults = append(f.h.Faults, Fault{Kind: "pg-restart", Start: at(8), End: at(8.5)})
				return f
			},
			want: map[int]string{7: "run 2 of 2 (api1"},
		},
		{
			name: "7: latency on the first node's Postgres link after its answer was stored explains nothing",
			given: func() *fixture {
				f := healthy("uncertain")
				f.exportRun(2, "acme", "alice", "export:1", "T1", "api1", 9.5)
				f.h.Faults = append(f.h.Faults, Fault{Kind: "latency", Target: "api0", Start: at(8), End: at(9),
					Detail: "api0→pg for 1s (+100ms per chunk)"})
				return f
			},
			want: map[int]string{7: "run 2 of 2 (api1"},
		},
		{
			name: "7: the first run's node killed before its answer was stored holds",
			given: func() *fixture {
				f := healthy("uncertain")
				f.exportRun(2, "acme", "alice", "export:1", "T1", "api1", 9)
				f.h.Faults = append(f.h.Faults, Fault{Kind: "kill", Target: "api0", Start: at(6.31), End: at(7)})
				return f
			},
		},
		{
			name: "7: Redis restarted after the first answer was stored holds",
			given: func() *fixture {
				f := healthy("uncertain")
				f.exportRun(2, "acme", "alice", "export:1", "T1", "api1", 12)
				f.h.Faults = append(f.h.Faults, Fault{Kind: "redis-restart", Start: at(10), End: at(11)})
				return f
			},
		},
		{
			name: "7: records in Postgres: a second run after the first node was killed mid-run",
			given: func() *fixture {
				f := healthy("uncertain")
				f.h.Meta.Store = "postgres"
				f.exportRun(2, "acme", "alice", "export:1", "T1", "api1", 9)
				f.h.Faults = append(f.h.Faults, Fault{Kind: "kill", Target: "api0", Start: at(6.1), End: at(7)})
				return f
			},
			want: map[int]string{7: "one ledger row per export key"},
		},
		// Invariant 5 under retry excuses only a fault on the caller.
		{
			name: "5: under retry, latency on an API node's Redis link explains no second call",
			given: func() *fixture {
				f := healthy("retry")
				f.h.Meta.Starts = true
				f.h.Rows[0].Attempt = 2
				f.h.Gen = nil
				f.start("T1", "", 2.5)
				f.start("T1", "", 34)
				f.h.Faults = append(f.h.Faults, Fault{Kind: "latency", Target: "api0", Start: at(3), End: at(4),
					Detail: "api0→redis for 1s (+100ms per chunk)"})
				return f
			},
			want: map[int]string{5: "no fault on an earlier call's process"},
		},
		{
			name: "5: under retry, a Redis restart explains no second call",
			given: func() *fixture {
				f := healthy("retry")
				f.h.Meta.Starts = true
				f.h.Rows[0].Attempt = 2
				f.h.Gen = nil
				f.start("T1", "", 2.5)
				f.start("T1", "", 34)
				f.h.Faults = append(f.h.Faults, Fault{Kind: "redis-restart", Start: at(3), End: at(4)})
				return f
			},
			want: map[int]string{5: "no fault on an earlier call's process"},
		},
		{
			name: "5: under retry, a fault on the other worker explains no second call",
			given: func() *fixture {
				f := healthy("retry")
				f.h.Meta.Starts = true
				f.h.Rows[0].Attempt = 2
				f.h.Gen = nil
				f.start("T1", "worker0", 2.5)
				f.start("T1", "worker1", 34)
				f.h.Faults = append(f.h.Faults, Fault{Kind: "kill", Target: "worker1", Start: at(3), End: at(4)})
				return f
			},
			want: map[int]string{5: "no fault on an earlier call's process"},
		},
		{
			name: "5: under retry, the caller's pause explains the second call",
			given: func() *fixture {
				f := healthy("retry")
				f.h.Meta.Starts = true
				f.h.Rows[0].Attempt = 2
				f.h.Gen = nil
				f.start("T1", "worker0", 2.5)
				f.start("T1", "worker1", 34)
				f.h.Faults = append(f.h.Faults, Fault{Kind: "pause", Target: "worker0", Start: at(3), End: at(4)})
				return f
			},
		},
		// Other identities' cancels, exports and recovers (invariant 3).
		{
			name: "3: another user's cancel answered 404, yet the task ends cancelled",
			given: func() *fixture {
				f := newFixture("uncertain")
				f.task("T1", "acme", "alice", "poster:1", dogs, "cancelled", 1)
				f.submit("acme", "alice", "poster:1", dogs, 202, "T1", false)
				f.other("acme", "bob", routeCancel, "T1", 404, "not_found", 2.5)
				f.action("poster:1", "cancelled", 5)
				return f
			},
			want: map[int]string{8: "nobody"},
		},
		{
			name: "3: another user's export answered 200",
			given: func() *fixture {
				f := healthy("uncertain")
				f.other("acme", "bob", routeExport, "T1", 200, "", 7)
				f.h.Requests[len(f.h.Requests)-1].ExportID = 2
				f.exportRun(2, "acme", "bob", "snoop:1", "T1", "api0", 7)
				return f
			},
			want: map[int]string{3: `user "bob"`},
		},
		{
			name: "3: another user's export answered 404, yet charged to the task",
			given: func() *fixture {
				f := healthy("uncertain")
				f.other("acme", "bob", routeExport, "T1", 404, "not_found", 7)
				f.exportRun(2, "acme", "bob", "snoop:1", "T1", "api0", 7)
				return f
			},
			want: map[int]string{3: "ledger"},
		},
		{
			name: "3: another tenant's recover answered 409: the task's existence leaks",
			given: func() *fixture {
				f := healthy("uncertain")
				f.other("globex", "alice", routeRecover, "T1", 409, "not_recoverable", 7)
				return f
			},
			want: map[int]string{3: "409"},
		},
		{
			name: "3: another tenant's export answered 429 rate_limited holds: the caller's own limit says nothing of the task",
			given: func() *fixture {
				f := healthy("uncertain")
				f.other("globex", "alice", routeExport, "T1", 429, "rate_limited", 7)
				f.other("acme", "bob", routeCancel, "T1", 429, "rate_limited", 7)
				return f
			},
		},
		{
			name: "3: another tenant's export answered 429 of another code: the task's existence leaks",
			given: func() *fixture {
				f := healthy("uncertain")
				f.other("globex", "alice", routeExport, "T1", 429, "export_in_progress", 7)
				return f
			},
			want: map[int]string{3: "429"},
		},
		{
			name: "3: other identities' cancel, export, recover and poll answered 404 hold",
			given: func() *fixture {
				f := healthy("uncertain")
				f.other("acme", "bob", routeCancel, "T1", 404, "not_found", 7)
				f.other("globex", "alice", routeExport, "T1", 404, "not_found", 7)
				f.other("acme", "bob", routeRecover, "T1", 404, "not_found", 7)
				f.other("acme", "bob", routeTask, "T1", 404, "not_found", 7)
				f.other("acme", "bob", routeTask, "T1", 503, "task_store_unavailable", 7)
				return f
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := Check(tc.given().h)
			if len(got) != len(invariantNames)-1 {
				t.Fatalf("Check returned %d results, want %d", len(got), len(invariantNames)-1)
			}
			for _, r := range got {
				want, violated := tc.want[r.N]
				switch {
				case violated && r.Holds:
					t.Errorf("invariant %d holds, want it violated (%q)", r.N, want)
				case violated && !strings.Contains(r.Examples[0], want):
					t.Errorf("invariant %d: first example %q, want it to mention %q", r.N, r.Examples[0], want)
				case !violated && !r.Holds:
					t.Errorf("invariant %d violated, want it to hold: %v", r.N, r.Examples)
				}
			}
			if Holds(got) != (len(tc.want) == 0) {
				t.Errorf("Holds = %v with %d invariants expected violated", Holds(got), len(tc.want))
			}
		})
	}
}

// TestHistoryRoundTrip writes a history as JSON lines and reads it back:
// a history file can be checked again without a run.
func TestHistoryRoundTrip(t *testing.T) {
	t.Parallel()
	f := healthy("uncertain")
	f.submit("acme", "alice", "poster:1", Params{Prompt: "a cat", AspectRatio: "1:1", N: 1}, 202, "T1", true)
	f.h.Faults = append(f.h.Faults, Fault{Kind: "kill", Target: "api0", Start: at(3), End: at(4)})
	var buf bytes.Buffer
	rec := newRecorder(&buf)
	rec.meta(f.h.Meta)
	for _, q := range f.h.Requests {
		rec.request(q)
	}
	for _, a := range f.h.Actions {
		rec.action(a)
	}
	for _, g := range f.h.Gen {
		rec.gen(g)
	}
	for _, x := range f.h.Faults {
		rec.fault(x)
	}
	for _, w := range f.h.Rows {
		rec.row(w)
	}
	for _, e := range f.h.Exports {
		rec.export(e)
	}
	if err := rec.flush(); err != nil {
		t.Fatal(err)
	}
	got, err := ReadHistory(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Requests) != len(f.h.Requests) || len(got.Rows) != 1 || len(got.Exports) != 1 || len(got.Faults) != 1 || len(got.Gen) != 1 || len(got.Actions) != 1 {
		t.Fatalf("read back %d requests, %d rows, %d faults, %d gen, %d actions",
			len(got.Requests), len(got.Rows), len(got.Faults), len(got.Gen), len(got.Actions))
	}
	want, again := Check(rec.history()), Check(got)
	for i := range want {
		if want[i].Holds != again[i].Holds || want[i].Violations != again[i].Violations {
			t.Errorf("invariant %d: %+v from memory, %+v from the file", i+1, want[i], again[i])
		}
	}
	if Holds(again) {
		t.Error("the reworded replay in the file went unnoticed")
	}
}

// writeHistory writes h as a run would.
func writeHistory(t *testing.T, path string, h History) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rec := newRecorder(f)
	rec.meta(h.Meta)
	for _, q := range h.Requests {
		rec.request(q)
	}
	for _, a := range h.Actions {
		rec.action(a)
	}
	for _, g := range h.Gen {
		rec.gen(g)
	}
	for _, x := range h.Faults {
		rec.fault(x)
	}
	for _, w := range h.Rows {
		rec.row(w)
	}
	for _, e := range h.Exports {
		rec.export(e)
	}
	if err := rec.flush(); err != nil {
		t.Fatal(err)
	}
}

func FuzzReadHistory(f *testing.F) {
	f.Add([]byte(`{"type":"meta","seed":1}` + "\n" + `{"type":"req","status":202,"task_id":"x"}` + "\n"))
	f.Add([]byte(`{"type":"row","id":"x","state":"succeeded"}`))
	f.Add([]byte(`{"type":"export","id":1,"idempotency_key":"k","proc":"api0"}` + "\n" +
		`{"type":"req","route":"POST /v1/tasks/{id}/export","status":200,"export_id":2}`))
	f.Add([]byte(`{"type":"nope"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ReadHistory(bytes.NewReader(b))
		if err != nil {
			return
		}
		// Whatever parses can be checked without a panic.
		Check(h)
	})
}
