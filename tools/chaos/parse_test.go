package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestParseLogLine(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 3, 8, 37, 13, 502e6, time.UTC)
	tests := []struct {
		name   string
		given  string
		want   GenCall
		wantOK bool
	}{
		{
			name:   "done",
			given:  `time=2026-12-03T08:37:13.502Z level=INFO msg="task done" task=0b5c7e1e-5f1a-4a53-9d51-6a3c1f0e2b11 images=2`,
			want:   GenCall{Task: "0b5c7e1e-5f1a-4a53-9d51-6a3c1f0e2b11", Proc: "w", Phase: "end", Result: "done", At: at},
			wantOK: true,
		},
		{
			name:   "uncertain",
			given:  `time=2026-12-03T08:37:13.502Z level=INFO msg="task uncertain: upstream timed out; will reconcile" task=x`,
			want:   GenCall{Task: "x", Proc: "w", Phase: "end", Result: "uncertain", At: at},
			wantOK: true,
		},
		{
			name:   "failed",
			given:  `time=2026-12-03T08:37:13.502Z level=INFO msg="task failed" task=y err="upstream refused the prompt (#fail)"`,
			want:   GenCall{Task: "y", Proc: "w", Phase: "end", Result: "failed", At: at},
			wantOK: true,
		},
		{
			name:   "partial",
			given:  `time=2026-12-03T08:37:13.502Z level=INFO msg="task failed with partial results; POST /v1/tasks/{id}/recover resumes it" task=z`,
			want:   GenCall{Task: "z", Proc: "w", Phase: "end", Result: "partial", At: at},
			wantOK: true,
		},
		{
			name:   "a reconcile is no generation",
			given:  `time=2026-12-03T08:37:13.502Z level=INFO msg="task reconciled: the upstream had finished" task=r images=1`,
			want:   GenCall{Task: "r", Proc: "w", Phase: "reconcile", At: at},
			wantOK: true,
		},
		{name: "another message", given: `time=2026-12-03T08:37:13.502Z level=WARN msg="pgstore: worker: lease lost; outcome discarded" task=x attempt=1`},
		{name: "another task message", given: `time=2026-12-03T08:37:13.502Z level=INFO msg="task cancelled" task=x`},
		{name: "bad time", given: `time=yesterday level=INFO msg="task done" task=x`},
		{name: "not slog", given: `chaos: start worker0 at 2026-12-03T08:37:13Z`},
		{name: "empty", given: ``},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, ok := parseLogLine("w", tc.given)
			if ok != tc.wantOK || got != tc.want {
				t.Errorf("parseLogLine(%q) = %+v, %v; want %+v, %v", tc.given, got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func FuzzParseLogLine(f *testing.F) {
	f.Add(`time=2026-12-03T08:37:13.502Z level=INFO msg="task done" task=x images=2`)
	f.Add(`time=2026-12-03T08:37:13.502Z level=INFO msg="task reconciled: x" task=r`)
	f.Add(`msg="task"`)
	f.Fuzz(func(t *testing.T, line string) {
		g, ok := parseLogLine("w", line)
		if !ok {
			return
		}
		if g.Task == "" || g.Proc != "w" || (g.Phase != "end" && g.Phase != "reconcile") {
			t.Fatalf("parsed %q into %+v", line, g)
		}
	})
}

// TestGenCalls reads a worker's log: the outcome a reconcile logs right
// after "task reconciled" is no generator call; a run after "the upstream
// never got it" is one.
func TestGenCalls(t *testing.T) {
	t.Parallel()
	log := `chaos: start worker0 at 2026-12-03T08:48:00Z
time=2026-12-03T08:48:12.088Z level=INFO msg="task uncertain: upstream timed out; will reconcile" task=a
time=2026-12-03T08:48:41.090Z level=INFO msg="task reconciled: the upstream had finished" task=a images=1
time=2026-12-03T08:48:41.093Z level=INFO msg="task done" task=a images=1
time=2026-12-03T08:48:42.000Z level=INFO msg="task reconciled: the upstream never got it; running it again" task=b
time=2026-12-03T08:48:45.000Z level=INFO msg="task done" task=b images=1
time=2026-12-03T08:48:45.010Z level=INFO msg="task done" task=c images=2
`
	path := filepath.Join(t.TempDir(), "worker0.log")
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := genCalls("worker0", path)
	if err != nil {
		t.Fatal(err)
	}
	var calls []string
	for _, g := range got {
		calls = append(calls, g.Task+":"+g.Phase+":"+g.Result)
	}
	want := []string{"a:end:uncertain", "a:reconcile:", "b:reconcile:", "b:end:done", "c:end:done"}
	if !slices.Equal(calls, want) {
		t.Errorf("genCalls = %v, want %v", calls, want)
	}
}

// TestDeck: the same seed deals the same kinds; every round deals each
// allowed kind once.
func TestDeck(t *testing.T) {
	t.Parallel()
	deal := func(seed uint64, kinds []string, n int) []string {
		nem := &nemesis{rng: rand.New(rand.NewPCG(seed, 1)), kinds: kinds}
		out := make([]string, n)
		for i := range out {
			out[i] = nem.pick()
		}
		return out
	}
	a, b := deal(7, faultKinds, 3*len(faultKinds)), deal(7, faultKinds, 3*len(faultKinds))
	if !slices.Equal(a, b) {
		t.Fatalf("seed 7 dealt %v, then %v", a, b)
	}
	for r := range 3 {
		round := slices.Clone(a[r*len(faultKinds) : (r+1)*len(faultKinds)])
		slices.Sort(round)
		want := slices.Clone(faultKinds)
		slices.Sort(want)
		if !slices.Equal(round, want) {
			t.Errorf("round %d dealt %v, want each kind once", r, round)
		}
	}
	if c := deal(8, faultKinds, len(faultKinds)); slices.Equal(c, a[:len(faultKinds)]) {
		t.Errorf("seeds 7 and 8 dealt the same round %v", c)
	}
	if got := deal(1, []string{"flushall"}, 3); !slices.Equal(got, []string{"flushall", "flushall", "flushall"}) {
		t.Errorf("one allowed kind dealt %v", got)
	}
}

// TestDealMeetsEveryKindWhenTheWindowIsShort: faults that outlast the
// window (a loaded machine's slow restarts) still leave every kind of the
// first round dealt, the late ones after the window with a short one of
// their own; a window that fits more than a round deals on until it closes.
func TestDealMeetsEveryKindWhenTheWindowIsShort(t *testing.T) {
	t.Parallel()
	var log []string
	nem := &nemesis{rng: rand.New(rand.NewPCG(1, 1)), kinds: faultKinds, log: func(string, ...any) { log = append(log, "") }}
	var got []string
	type call struct{ at, until time.Time }
	var calls []call
	start := time.Now()
	until := start.Add(time.Second)
	nem.deal(t.Context(), until, func(_ context.Context, kind string, u time.Time) {
		got = append(got, kind)
		calls = append(calls, call{time.Now(), u})
		time.Sleep(300 * time.Millisecond) // each fault takes longer than its share
	})
	slices.Sort(got)
	want := slices.Clone(faultKinds)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("dealt %v, want each kind once", got)
	}
	if len(log) == 0 {
		t.Errorf("no kind dealt overdue: the test did not outlast the window")
	}
	// A fault is dealt within the window (until itself), or after it
	// with a window of its own of overdueWindow. How much of the window
	// is left when a fault starts is the machine's speed, not deal's:
	// inject gives every fault it is dealt at least minFault.
	for i, c := range calls {
		onTime := c.until.Equal(until)
		overdue := c.until.After(until) && !c.until.After(c.at.Add(overdueWindow))
		if !onTime && !overdue {
			t.Errorf("fault %d was dealt at %v with its window ending at %v: neither the run's window (%v) nor an overdue one of %v",
				i, c.at.Sub(start), c.until.Sub(start), until.Sub(start), overdueWindow)
		}
	}

	// A quick fault: the window holds more than a round, and nothing is
	// dealt after it.
	nem = &nemesis{rng: rand.New(rand.NewPCG(2, 1)), kinds: []string{"kill", "pause"}, log: func(string, ...any) {}}
	n, late := 0, 0
	until = time.Now().Add(3 * time.Second)
	nem.deal(t.Context(), until, func(_ context.Context, _ string, u time.Time) {
		n++
		if !u.Equal(until) {
			late++
		}
	})
	if n <= 2 || late != 0 {
		t.Errorf("a 3 s window of instant faults dealt %d kinds, %d of them late; want more than a round, none late", n, late)
	}
}

func TestParseKindsAndPolicy(t *testing.T) {
	t.Parallel()
	if k, err := parseKinds("all", "redis"); err != nil || len(k) != len(faultKinds) {
		t.Errorf("all: %v, %v", k, err)
	}
	if k, err := parseKinds("none", "redis"); err != nil || len(k) != 0 {
		t.Errorf("none: %v, %v", k, err)
	}
	if k, err := parseKinds("kill, flushall", "redis"); err != nil || !slices.Equal(k, []string{"kill", "flushall"}) {
		t.Errorf("kill, flushall: %v, %v", k, err)
	}
	if _, err := parseKinds("kill,clock-skew", "redis"); err == nil {
		t.Error("an unknown kind was accepted")
	}
	// With the records in Postgres there is no Redis to break.
	k, err := parseKinds("all", "postgres")
	if err != nil || slices.Contains(k, "flushall") || slices.Contains(k, "redis-restart") || !slices.Contains(k, "commit-kill") ||
		len(k) != len(faultKinds)-2 {
		t.Errorf("all under postgres: %v, %v", k, err)
	}
	if _, err := parseKinds("kill,flushall", "postgres"); err == nil {
		t.Error("flushall accepted with the records in Postgres")
	}
	if _, err := parseOptions([]string{"-store", "memcached"}, io.Discard); err == nil {
		t.Error("-store memcached accepted")
	}
	if o, err := parseOptions(nil, io.Discard); err != nil || o.store != "redis" || o.policy != defaultPolicy {
		t.Errorf("defaults: store %q policy %q, %v", o.store, o.policy, err)
	}
	if p, err := parsePolicy("images=uncertain,music=retry"); err != nil || p["images"] != "uncertain" || p["music"] != "retry" {
		t.Errorf("policy: %v, %v", p, err)
	}
	for _, bad := range []string{"images", "images=maybe"} {
		if _, err := parsePolicy(bad); err == nil {
			t.Errorf("policy %q accepted", bad)
		}
	}
	var errOut bytes.Buffer
	if _, err := parseOptions([]string{"-duration", "0s"}, &errOut); err == nil {
		t.Error("-duration 0s accepted")
	}
	if _, err := parseOptions([]string{"extra"}, &errOut); err == nil {
		t.Error("a stray argument accepted")
	}
}

// TestRecorderConcurrent records from many goroutines at once (run with
// -race) and reads every event back from the file.
func TestRecorderConcurrent(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	rec := newRecorder(&buf)
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 50 {
				rec.request(Request{Client: i, Action: j, Route: routeSubmit, Status: 202})
				rec.gen(GenCall{Task: "t", Proc: "w", Phase: "end"})
			}
		}()
	}
	wg.Wait()
	if err := rec.flush(); err != nil {
		t.Fatal(err)
	}
	h, err := ReadHistory(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Requests) != 32*50 || len(h.Gen) != 32*50 || len(rec.history().Requests) != 32*50 {
		t.Fatalf("read back %d requests and %d calls, want %d each", len(h.Requests), len(h.Gen), 32*50)
	}
}

// FuzzFlagLists: the -faults and -policy parsers accept only what they
// name, and never panic.
func FuzzFlagLists(f *testing.F) {
	f.Add("kill,flushall")
	f.Add("images=uncertain,music=retry")
	f.Add(" , =,")
	f.Fuzz(func(t *testing.T, s string) {
		if kinds, err := parseKinds(s, "postgres"); err == nil {
			for _, k := range kinds {
				if !slices.Contains(faultKinds, k) {
					t.Fatalf("parseKinds(%q) accepted %q", s, k)
				}
			}
		}
		if pol, err := parsePolicy(s); err == nil {
			for kind, p := range pol {
				if p != "uncertain" && p != "retry" {
					t.Fatalf("parsePolicy(%q) accepted %s=%q", s, kind, p)
				}
			}
		}
	})
}

// TestWorkerPolicy: the policy the checker judges by is the one the
// workers say they run; asking for another than the example's own from
// workers that do not say is an error, not a silent default.
func TestWorkerPolicy(t *testing.T) {
	t.Parallel()
	logs := map[string]string{
		"silent": "idemgate example worker running (4 workers)\n  postgres: postgres://…\n",
		"retry":  "idemgate example worker running (4 workers)\n  postgres: postgres://…\n  policy: images=retry,music=retry\n",
		"bad":    "  policy: images=sometimes\n",
	}
	dir := t.TempDir()
	sysWith := func(log string) *system {
		path := filepath.Join(dir, log+".log")
		if err := os.WriteFile(path, []byte(logs[log]), 0o644); err != nil {
			t.Fatal(err)
		}
		return &system{procs: []*proc{
			{name: "api0", kind: apiNode, logf: "/nonexistent"},
			{name: "worker0", kind: workerProc, logf: path},
			{name: "worker1", kind: workerProc, logf: path},
		}}
	}
	retry := map[string]string{"images": "retry"}
	uncertain := map[string]string{"images": "uncertain"}
	tests := []struct {
		name    string
		given   string
		when    map[string]string
		want    map[string]string
		wantErr bool
	}{
		{name: "the default from a worker that does not say", given: "silent", when: uncertain, want: uncertain},
		{name: "retry from a worker that does not say", given: "silent", when: retry, wantErr: true},
		{name: "retry from a worker that says retry", given: "retry", when: retry, want: map[string]string{"images": "retry", "music": "retry"}},
		{name: "uncertain from a worker that says retry", given: "retry", when: uncertain, wantErr: true},
		{name: "a policy line that does not parse", given: "bad", when: uncertain, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := sysWith(tc.given).workerPolicy(tc.when)
			if (err != nil) != tc.wantErr || (err == nil && !samePolicy(got, tc.want)) {
				t.Errorf("workerPolicy(%v) = %v, %v; want %v (error %v)", tc.when, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// TestRecordingPathTask: every request on a task route records whose
// task it tried, whatever the answer, and names its route.
func TestRecordingPathTask(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"status":404,"code":"not_found"}`))
	}))
	t.Cleanup(srv.Close)
	rec := newRecorder(nil)
	hc := &http.Client{Transport: &recording{rec: rec, base: http.DefaultTransport}}
	for _, tc := range []struct{ method, path, route string }{
		{http.MethodGet, "/v1/tasks/T1", routeTask},
		{http.MethodPost, "/v1/tasks/T1/cancel", routeCancel},
		{http.MethodPost, "/v1/tasks/T1/export", routeExport},
		{http.MethodPost, "/v1/tasks/T1/recover", routeRecover},
	} {
		req, err := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		h := rec.history()
		q := h.Requests[len(h.Requests)-1]
		if q.Route != tc.route || q.PathTask != "T1" || q.Status != 404 || q.Code != "not_found" || q.TaskID != "" {
			t.Errorf("%s %s recorded as %+v", tc.method, tc.path, q)
		}
	}
}

func TestWorkerRunning(t *testing.T) {
	t.Parallel()
	for line, want := range map[string]bool{
		"idemgate example worker running (4 workers)\n":         true,
		"idemgate example worker worker0 running (4 workers)\n": true,
		"chaos: start worker0 at 2026-12-03T18:00:00Z\n":        false,
		"idemgate example worker worker0 starting\n":            false,
	} {
		if got := workerRunning.MatchString(line); got != want {
			t.Errorf("workerRunning on %q = %v, want %v", line, got, want)
		}
	}
}

// TestReadyStartsAgainAProcessThatExitsBeforeItIsReady: a process whose
// first run exits before it is ready (the example's first connection timed
// out on a loaded machine) is run again, and one that never gets ready
// ends the start with errExited after startAttempts runs.
func TestReadyStartsAgainAProcessThatExitsBeforeItIsReady(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	script := filepath.Join(dir, "worker.sh")
	// Each run counts itself; the run numbered $1 and later get ready.
	body := `#!/bin/sh
n=$(cat "` + dir + `/runs" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "` + dir + `/runs"
if [ "$n" -lt "$1" ]; then echo "failed to connect"; exit 1; fi
echo "idemgate example worker running (test)"; exec sleep 30
`
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	runs := func() string {
		b, _ := os.ReadFile(filepath.Join(dir, "runs"))
		return string(bytes.TrimSpace(b))
	}
	for _, tt := range []struct {
		readyAt  string
		wantErr  bool
		wantRuns string
	}{
		{readyAt: "2", wantRuns: "2"},
		{readyAt: "9", wantErr: true, wantRuns: "3"},
	} {
		os.Remove(filepath.Join(dir, "runs"))
		p := &proc{name: "worker0", kind: workerProc, args: []string{tt.readyAt}, logf: filepath.Join(dir, "worker0-"+tt.readyAt+".log")}
		s := &system{bin: script, procs: []*proc{p}}
		if err := p.start(s.bin); err != nil {
			t.Fatal(err)
		}
		err := s.ready(t.Context(), p)
		p.kill()
		if (err != nil) != tt.wantErr || (err != nil && !errors.Is(err, errExited)) {
			t.Errorf("ready at run %s: err %v, want error %v (errExited)", tt.readyAt, err, tt.wantErr)
		}
		if got := runs(); got != tt.wantRuns {
			t.Errorf("ready at run %s: %s runs, want %s", tt.readyAt, got, tt.wantRuns)
		}
	}
}

// supervisedScript writes a process that appends its pid to dir/pids and
// then exits at once when its run's number (counted in dir/runs) is in
// exitRuns, else sleeps.
func supervisedScript(t *testing.T, dir, exitRuns string) string {
	t.Helper()
	script := filepath.Join(dir, "node.sh")
	body := `#!/bin/sh
n=$(cat "` + dir + `/runs" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "` + dir + `/runs"
echo $$ >> "` + dir + `/pids"
case " ` + exitRuns + ` " in *" $n "*) echo "failed to connect"; exit 1;; esac
exec sleep 60
`
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return script
}

// alivePids returns the pids of dir/pids that still run.
func alivePids(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "pids"))
	if err != nil && !errors.Is(err, os.ErrNotExist) { // no run has begun yet
		t.Fatal(err)
	}
	var alive []string
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		if syscall.Kill(pid, 0) == nil {
			alive = append(alive, f)
		}
	}
	return alive
}

func TestSuperviseStartsAgainAProcessThatExitsOnItsOwnNotOneKilled(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := &proc{name: "api0", kind: apiNode, logf: filepath.Join(dir, "api0.log")}
	s := &system{bin: supervisedScript(t, dir, "1"), procs: []*proc{p}}
	runs := func() string {
		b, _ := os.ReadFile(filepath.Join(dir, "runs"))
		return string(bytes.TrimSpace(b))
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	var logged atomic.Int32
	go func() {
		defer close(done)
		s.supervise(ctx, 10*time.Millisecond, func(string, ...any) { logged.Add(1) })
	}()
	defer func() { cancel(); <-done; p.kill() }()

	if err := p.start(s.bin); err != nil {
		t.Fatal(err)
	}
	// Run 1 exits at once: the supervisor starts run 2, which stays.
	for deadline := time.Now().Add(time.Minute); runs() != "2"; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("runs %q a minute after run 1 exited, want 2", runs())
		}
	}
	// A killed process is the nemesis's: many ticks pass, no run starts.
	p.kill()
	time.Sleep(50 * 10 * time.Millisecond)
	if got := runs(); got != "2" || p.running() {
		t.Errorf("after kill: runs %q, running %v; want 2, false", got, p.running())
	}
	if err := p.start(s.bin); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); runs() != "3"; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("runs %q a minute after the nemesis's start, want 3", runs())
		}
	}
	// Only run 1's exit was the supervisor's to answer (logged after
	// its restart, so read last).
	if n := logged.Load(); n != 1 {
		t.Errorf("%d restarts logged, want 1", n)
	}
}

// Kills and starts (two at once, as a fault's end and healAll) racing the
// supervisor never leave two runs of one process.
func TestSuperviseAndFaultsNeverRunAProcessTwice(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := &proc{name: "worker0", kind: workerProc, logf: filepath.Join(dir, "worker0.log")}
	// Every third run exits on its own, for the supervisor to start again.
	var exits []string
	for n := 3; n <= 120; n += 3 {
		exits = append(exits, strconv.Itoa(n))
	}
	s := &system{bin: supervisedScript(t, dir, strings.Join(exits, " ")), procs: []*proc{p}}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); s.supervise(ctx, time.Millisecond, func(string, ...any) {}) }()
	if err := p.start(s.bin); err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		p.kill()
		time.Sleep(time.Duration(i%4) * time.Millisecond)
		// The fault's end and healAll both start it, racing the
		// supervisor too when a run exits on its own.
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				if err := p.start(s.bin); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		// Time for the runs begun to write their pids.
		time.Sleep(time.Duration(20+i%5) * time.Millisecond)
		if alive := alivePids(t, dir); len(alive) > 1 {
			t.Fatalf("after fault %d: runs %v alive at once", i, alive)
		}
	}
	cancel()
	<-done
	p.kill()
	if alive := alivePids(t, dir); len(alive) != 0 {
		t.Errorf("runs %v alive after the last kill", alive)
	}
}
