package main

import (
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate"
)

// limit adds a change of the images kind's limits, asked at s and set
// 50 ms later.
func (f *fixture) limit(maxRun, perTenant int, paused bool, s float64) {
	f.h.Limits = append(f.h.Limits, Limit{Kind: limitKind, MaxRunning: maxRun, PerTenant: perTenant, Paused: paused,
		Asked: at(s), Set: at(s + 0.05)})
}

// call adds a generator call of task by proc from s to e (the upstream's
// planned end) and the task's row for tenant, created at created.
func (f *fixture) call(task, tenant, proc string, created, s, e float64) {
	f.h.Meta.Starts = true
	f.task(task, tenant, "alice", "k:"+task, dogs, "succeeded", 1)
	f.h.Rows[len(f.h.Rows)-1].CreatedAt = at(created)
	f.h.Gen = append(f.h.Gen, GenCall{Task: task, Proc: proc, Phase: "start", Result: "ok", At: at(s), Done: at(e)})
}

// exportOf adds an export request of task under key, answered status with
// ledger row exportID.
func (f *fixture) exportOf(tenant, user, key, task string, status int, code string, exportID int64, s float64) {
	q := Request{Tenant: tenant, User: user, Route: routeExport, Key: key, PathTask: task, Sent: at(s), Done: at(s + 0.1),
		Status: status, Code: code}
	if status == 200 {
		q.TaskID, q.ExportID, q.Images = task, exportID, 1
	}
	f.h.Requests = append(f.h.Requests, q)
}

// TestCheckMore holds the invariants of short leases, limits and floods
// (9-13): a hand-made violating history for each, and the near misses
// that must hold.
func TestCheckMore(t *testing.T) {
	t.Parallel()
	cats := Params{Prompt: "a cat", AspectRatio: "1:1", N: 1}
	tests := []struct {
		name  string
		given func() *fixture
		want  map[int]string
	}{
		{
			name: "9: the first try with a fresh key gets key_reused",
			given: func() *fixture {
				f := healthy("uncertain")
				f.submit("acme", "alice", "poster:9", cats, 409, "", false)
				return f
			},
			want: map[int]string{9: "the first try"},
		},
		{
			name: "9: an honest retry gets key_reused",
			given: func() *fixture {
				f := healthy("uncertain")
				f.submit("acme", "alice", "poster:1", dogs, 409, "", false)
				f.h.Requests[len(f.h.Requests)-1].Sent = at(2.5)
				return f
			},
			want: map[int]string{9: "an honest retry"},
		},
		{
			name: "9: an export retried on its own task gets key_reused",
			given: func() *fixture {
				f := healthy("uncertain")
				f.exportOf("acme", "alice", "export:2", "T1", 0, "", 0, 7)
				f.exportOf("acme", "alice", "export:2", "T1", 409, string(idemgate.CodeKeyReused), 0, 8)
				return f
			},
			want: map[int]string{9: "the key's own"},
		},
		{
			name: "9: a reworded retry and an export id reused on another task get key_reused: no false conflict",
			given: func() *fixture {
				f := healthy("uncertain")
				f.submit("acme", "alice", "poster:1", cats, 409, "", false)
				f.h.Requests[len(f.h.Requests)-1].Sent = at(2.5)
				f.task("T2", "acme", "alice", "poster:2", cats, "succeeded", 1)
				f.gen("T2", "worker1", 4)
				f.exportOf("acme", "alice", "export:1", "T2", 409, string(idemgate.CodeKeyReused), 0, 9)
				f.h.Requests[len(f.h.Requests)-1].Sent = at(9)
				return f
			},
		},
		{
			name: "10: two 200s under one export key name two ledger rows (records in Postgres)",
			given: func() *fixture {
				f := healthy("uncertain")
				f.h.Meta.Store = "postgres"
				f.exportRun(2, "acme", "alice", "export:1", "T1", "api1", 8)
				f.export("acme", "alice", "export:1", "T1", 200, 2, false, 9)
				return f
			},
			want: map[int]string{7: "whatever the faults", 10: "ledger row 2, earlier with row 1"},
		},
		{
			name: "10: two 200s under one export key, the first run's node killed before its answer was stored (Redis)",
			given: func() *fixture {
				f := healthy("uncertain")
				f.h.Faults = append(f.h.Faults, Fault{Kind: "kill", Target: "api0", Start: at(6.2), End: at(7)})
				f.exportRun(2, "acme", "alice", "export:1", "T1", "api1", 8)
				f.export("acme", "alice", "export:1", "T1", 200, 2, false, 9)
				return f
			},
		},
		{
			name: "10: two 200s under one export key, Redis flushed 2 s before the first run (Redis)",
			given: func() *fixture {
				f := healthy("uncertain")
				f.h.Faults = append(f.h.Faults, Fault{Kind: "flushall", Start: at(3.5), End: at(4)})
				f.exportRun(2, "acme", "alice", "export:1", "T1", "api1", 8)
				f.export("acme", "alice", "export:1", "T1", 200, 2, false, 9)
				return f
			},
			want: map[int]string{7: "nor Redis lost since", 10: "ledger row 2, earlier with row 1"},
		},
		{
			name: "10: two 200s under one export key, Redis flushed as the first run's handler began: its claim was wiped (Redis)",
			given: func() *fixture {
				f := healthy("uncertain")
				f.h.Faults = append(f.h.Faults, Fault{Kind: "flushall", Start: at(5.7), End: at(5.9)})
				f.exportRun(2, "acme", "alice", "export:1", "T1", "api1", 8)
				f.export("acme", "alice", "export:1", "T1", 200, 2, false, 9)
				return f
			},
		},
		{
			name: "11: an export key reused on another task is answered with the first task's export",
			given: func() *fixture {
				f := healthy("uncertain")
				f.task("T2", "acme", "alice", "poster:2", cats, "succeeded", 1)
				f.gen("T2", "worker1", 4)
				f.exportOf("acme", "alice", "export:1", "T2", 200, "", 1, 9)
				return f
			},
			want: map[int]string{11: "export of task T2 answered 200 with ledger row 1, an export of task T1"},
		},
		{
			name: "12: three calls at once under MaxRunning 2",
			given: func() *fixture {
				f := newFixture("uncertain")
				f.limit(2, 0, false, 0)
				f.call("A", "acme", "worker0", 4, 5, 7)
				f.call("B", "acme", "worker1", 4, 5.5, 7.5)
				f.call("C", "globex", "worker1", 4, 6, 8)
				return f
			},
			want: map[int]string{12: "3 calls running, MaxRunning 2"},
		},
		{
			name: "12: two calls of one tenant under MaxRunningPerTenant 1",
			given: func() *fixture {
				f := newFixture("uncertain")
				f.limit(0, 1, false, 0)
				f.call("A", "acme", "worker0", 4, 5, 7)
				f.call("B", "globex", "worker1", 4, 5.5, 7.5)
				f.call("C", "acme", "worker1", 4, 6, 8)
				return f
			},
			want: map[int]string{12: `2 calls of tenant "acme" running, MaxRunningPerTenant 1`},
		},
		{
			name: "12: a call starts while the kind is paused",
			given: func() *fixture {
				f := newFixture("uncertain")
				f.limit(0, 0, true, 0)
				f.call("A", "acme", "worker0", 4, 5, 7)
				return f
			},
			want: map[int]string{12: "paused"},
		},
		{
			name: "12: a call starts 4 s into a pause while another worker was stopped across its start",
			given: func() *fixture {
				f := newFixture("uncertain")
				f.limit(0, 0, true, 5)
				f.h.Faults = append(f.h.Faults, Fault{Kind: "pause", Target: "worker1", Start: at(4.5), End: at(8.5)})
				f.call("A", "acme", "worker0", 4, 9, 11)
				return f
			},
			want: map[int]string{12: "paused"},
		},
		{
			name: "12: a call starts 4 s into a pause, its own worker stopped from just before the pause until then: holds",
			given: func() *fixture {
				f := newFixture("uncertain")
				f.limit(0, 0, true, 5)
				// Its claim read the limits before the pause, at 4.4; the
				// worker stopped at 4.5 and logged the call once it woke.
				f.h.Faults = append(f.h.Faults, Fault{Kind: "pause", Target: "worker0", Start: at(4.5), End: at(8.5)})
				f.call("A", "acme", "worker0", 4, 9, 11)
				return f
			},
		},
		{
			name: "12: limits lowered while calls run, a killed caller's call, a claim that read the old limits: holds",
			given: func() *fixture {
				f := newFixture("uncertain")
				f.limit(3, 0, false, 0)
				f.call("A", "acme", "worker0", 4, 5, 9)
				f.call("B", "acme", "worker1", 4, 5.1, 9)
				f.limit(1, 0, false, 6)
				// Read the old limit just before the change returned.
				f.call("C", "acme", "worker1", 4, 6.5, 9)
				// worker0 killed at 10: its call with no end line stops.
				f.call("D", "acme", "worker0", 4, 9.5, 20)
				f.h.Faults = append(f.h.Faults, Fault{Kind: "kill", Target: "worker0", Start: at(10), End: at(11)})
				f.call("E", "acme", "worker1", 4, 10.5, 12)
				// Ended by its caller's log line before the next starts.
				f.h.Gen = append(f.h.Gen, GenCall{Task: "E", Proc: "worker1", Phase: "end", Result: "done", At: at(11)})
				f.call("F", "acme", "worker1", 4, 11.5, 13)
				return f
			},
		},
		{
			name: "13: a small tenant's task waits behind the whole flood",
			given: func() *fixture {
				f := newFixture("uncertain")
				f.h.Meta.Flood, f.h.Meta.GenTime = floodTenant, time.Second
				for i := range 20 {
					id := "F" + string(rune('a'+i))
					f.call(id, floodTenant, "worker0", 1, 2+float64(i), 3+float64(i))
				}
				f.call("S", "acme", "worker1", 2.5, 22, 23)
				return f
			},
			want: map[int]string{13: "after 19 of the flooding tenant's earlier tasks"},
		},
		{
			name: "13: a task claimed before its first upstream call (an attempt that never reached it) holds",
			given: func() *fixture {
				f := newFixture("uncertain")
				f.h.Meta.Flood, f.h.Meta.GenTime = floodTenant, time.Second
				for i := range 20 {
					id := "F" + string(rune('a'+i))
					f.call(id, floodTenant, "worker0", 1, 2+float64(i), 3+float64(i))
				}
				f.call("S", "acme", "worker1", 2.5, 22, 23)
				f.h.Rows[len(f.h.Rows)-1].Attempt = 3
				return f
			},
		},
		{
			name: "13: a small tenant's task served in turn during a flood holds",
			given: func() *fixture {
				f := newFixture("uncertain")
				f.h.Meta.Flood, f.h.Meta.GenTime = floodTenant, time.Second
				for i := range 20 {
					id := "F" + string(rune('a'+i))
					f.call(id, floodTenant, "worker0", 1, 2+float64(i), 3+float64(i))
				}
				f.call("S", "acme", "worker1", 2.5, 4.5, 5.5)
				return f
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := Check(tc.given().h)
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
		})
	}
}
