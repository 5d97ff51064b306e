package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/idemgate/idemgate/internal/opsbench"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/keyspace"
	"github.com/idemgate/idemgate/pgstore"
)

// opsBench is a database with tasks of two tenants, and the operator
// tools pointed at it.
type opsBench struct{ *opsbench.Bench }

func newOpsBench(t *testing.T) *opsBench {
	t.Helper()
	return &opsBench{opsbench.Seed(t, testenv.PostgresDSN(t), "runtime", "network")}
}

// run runs "idemgate tasks args..." and returns its exit code and output.
func (o *opsBench) run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return o.DSN
		}
		return ""
	}
	code := Main(context.Background(), append([]string{"tasks"}, args...),
		Env{Prog: "idemgate", Getenv: getenv, Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr})
	return code, stdout.String(), stderr.String()
}

// rows runs a command with -json that prints tasks.
func (o *opsBench) rows(t *testing.T, args ...string) []taskRow {
	t.Helper()
	code, out, errOut := o.run(t, append(args, "-json")...)
	if code != 0 {
		t.Fatalf("tasks %v: exit %d: %s", args, code, errOut)
	}
	var rows []taskRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		var one taskRow
		if err := json.Unmarshal([]byte(out), &one); err != nil {
			t.Fatalf("tasks %v: not JSON: %v\n%s", args, err, out)
		}
		rows = []taskRow{one}
	}
	return rows
}

func TestTasksList(t *testing.T) {
	t.Parallel()
	o := newOpsBench(t)
	tests := []struct {
		name  string
		given []string
		want  []string // task IDs, newest first
	}{
		{"all", []string{"list"}, []string{o.IDs[2], o.IDs[1], o.IDs[0]}},
		{"one tenant", []string{"list", "-tenant", "acme"}, []string{o.IDs[1], o.IDs[0]}},
		{"one kind", []string{"list", "-kind", "images"}, []string{o.IDs[2], o.IDs[0]}},
		{"a state none is in", []string{"list", "-state", "failed"}, nil},
		{"limit", []string{"list", "-limit", "1"}, []string{o.IDs[2]}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, r := range o.rows(t, tt.given...) {
				got = append(got, r.ID)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("tasks %v = %v, want %v", tt.given, got, tt.want)
			}
		})
	}
	// The table a person reads names every task and its state.
	code, out, _ := o.run(t, "list")
	if code != 0 || !strings.Contains(out, "STATE") || strings.Count(out, "pending") != 3 {
		t.Fatalf("table (exit %d):\n%s", code, out)
	}
}

func TestTasksShowCancelRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newOpsBench(t)
	id := o.IDs[0]

	code, out, _ := o.run(t, "show", id)
	if code != 0 || !strings.Contains(out, "state:") || !strings.Contains(out, "pending") || !strings.Contains(out, `"prompt"`) {
		t.Fatalf("show (exit %d):\n%s", code, out)
	}
	if rows := o.rows(t, "cancel", id, "-yes"); rows[0].State != string(pgstore.StateCancelled) {
		t.Fatalf("cancel: state %s", rows[0].State)
	}
	// Only a failed task can be retried.
	if code, _, errOut := o.run(t, "retry", o.IDs[1]); code != 1 || !strings.Contains(errOut, "not failed") {
		t.Fatalf("retry of a pending task: exit %d, %q", code, errOut)
	}
	if _, err := o.Pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'failed', attempt = 3, error = 'upstream refused' WHERE id = $1`, o.IDs[1]); err != nil {
		t.Fatal(err)
	}
	r := o.rows(t, "retry", o.IDs[1], "-yes")[0]
	if r.ID != o.IDs[1] || (r.State != string(pgstore.StatePending) && r.State != string(pgstore.StateRetrying)) || r.Error != "" {
		t.Fatalf("retry: %+v, want the same task runnable again with its error cleared", r)
	}
	if code, _, errOut := o.run(t, "show", "00000000-0000-0000-0000-000000000000"); code != 1 || !strings.Contains(errOut, "not found") {
		t.Fatalf("show of no task: exit %d, %q", code, errOut)
	}
}

func TestTasksLimitsPauseResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newOpsBench(t)
	limits := func(args ...string) limitsRow {
		t.Helper()
		code, out, errOut := o.run(t, append(args, "-json")...)
		if code != 0 {
			t.Fatalf("tasks %v: exit %d: %s", args, code, errOut)
		}
		var r limitsRow
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return r
	}
	if r := limits("limits", "images"); r != (limitsRow{Kind: "images", Runnable: 2}) {
		t.Fatalf("a kind never limited: %+v", r)
	}
	limits("limits", "images", "-max-running", "8")
	if r := limits("limits", "images", "-starts-per-second", "2.5"); r.MaxRunning != 8 || r.StartsPerSecond != 2.5 {
		t.Fatalf("a second flag must keep the first limit: %+v", r)
	}
	if r := limits("pause", "images"); !r.Paused || r.MaxRunning != 8 {
		t.Fatalf("pause: %+v", r)
	}
	stored, err := o.Store.KindLimits(ctx, "images")
	if err != nil || stored != (pgstore.KindLimits{MaxRunning: 8, StartsPerSecond: 2.5, Paused: true}) {
		t.Fatalf("stored limits %+v, %v", stored, err)
	}
	if r := limits("resume", "images"); r.Paused || r.MaxRunning != 8 {
		t.Fatalf("resume: %+v", r)
	}
	if l, _ := o.Store.KindLimits(ctx, "music"); l != (pgstore.KindLimits{}) {
		t.Fatalf("another kind changed: %+v", l)
	}
	code, out, _ := o.run(t, "limits", "images")
	if code != 0 || !strings.Contains(out, "MAX RUNNING") || !strings.Contains(out, "2.5") {
		t.Fatalf("table (exit %d):\n%s", code, out)
	}
}

// Operators changing one kind at once lose none of each other's changes:
// one pauses and resumes it again and again while others set its
// max-running, per-tenant and rate limits, through the commands' own
// code; each field ends at the last value its own operator set (a read of
// all limits then a write of all let one undo another's change).
func TestTasksConcurrentLimitChangesAreKept(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newOpsBench(t)
	const rounds = 30
	flagged := func(name string, i int) limitFlags {
		var f limitFlags
		switch name {
		case "max-running":
			f.maxRunning = intFlag{v: i + 1, set: true}
		case "max-running-per-tenant":
			f.perTenant = intFlag{v: 100 + i, set: true}
		case "starts-per-second":
			f.rate = floatFlag{v: float64(i) + 0.5, set: true}
		}
		return f
	}
	operators := []func(i int) (string, limitFlags){
		func(i int) (string, limitFlags) { return []string{"pause", "resume"}[i%2], limitFlags{} },
		func(i int) (string, limitFlags) { return "limits", flagged("max-running", i) },
		func(i int) (string, limitFlags) { return "limits", flagged("max-running-per-tenant", i) },
		func(i int) (string, limitFlags) { return "limits", flagged("starts-per-second", i) },
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, op := range operators {
		wg.Go(func() {
			<-start
			for i := range rounds {
				sub, f := op(i)
				if _, err := changeLimits(ctx, o.Store, sub, "images", f); err != nil {
					t.Errorf("tasks %s: %v", sub, err)
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	want := pgstore.KindLimits{Paused: (rounds-1)%2 == 0, MaxRunning: rounds, MaxRunningPerTenant: 100 + rounds - 1,
		StartsPerSecond: float64(rounds-1) + 0.5}
	if got, err := o.Store.KindLimits(ctx, "images"); err != nil || got != want {
		t.Fatalf("limits after concurrent operators = %+v, %v; want %+v", got, err, want)
	}
}

// Bad command lines get a clear error and change nothing.
func TestTasksBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newOpsBench(t)
	tests := []struct {
		name     string
		given    []string
		wantCode int
		wantErr  string
	}{
		{"no command", nil, 2, "Operator tools"},
		{"unknown command", []string{"purge"}, 2, "unknown command"},
		{"limits without a kind", []string{"limits"}, 2, "want 1 argument(s), got 0"},
		{"two IDs", []string{"show", "a", "b"}, 2, "want 1 argument(s), got 2"},
		{"unknown state", []string{"list", "-state", "done"}, 2, "want pending"},
		{"limit too large", []string{"list", "-limit", "100000"}, 2, "-limit 100000: want 1 to 1000"},
		{"limit zero", []string{"list", "-limit", "0"}, 2, "-limit 0: want 1 to 1000"},
		{"limit not a number", []string{"list", "-limit", "ten"}, 2, "invalid value"},
		{"a kind never named", []string{"pause", "imgaes"}, 1, `no task or limit has ever named kind "imgaes"`},
		{"a kind never named, limits", []string{"limits", "imgaes", "-max-running", "2"}, 1, "pass -new-kind"},
		{"a kind never named, resume", []string{"resume", "imgaes"}, 1, "a typo?"},
		{"rate above the bound", []string{"limits", "images", "-starts-per-second", "2e6"}, 2, "-starts-per-second"},
		{"negative limit", []string{"limits", "images", "-max-running", "-1"}, 2, "-max-running"},
		{"rate not a number", []string{"limits", "images", "-starts-per-second", "NaN"}, 2, "-starts-per-second"},
		{"not a number", []string{"limits", "images", "-max-running", "eight"}, 2, "invalid value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := o.run(t, tt.given...)
			if code != tt.wantCode || !strings.Contains(errOut, tt.wantErr) {
				t.Fatalf("tasks %v: exit %d, stderr %q; want exit %d saying %q", tt.given, code, errOut, tt.wantCode, tt.wantErr)
			}
		})
	}
	if l, _ := o.Store.KindLimits(ctx, "images"); l != (pgstore.KindLimits{}) {
		t.Fatalf("a refused command stored limits %+v", l)
	}
	var n int
	if err := o.Pool.QueryRow(ctx, `SELECT count(*) FROM idemgate_kind_limits WHERE kind = 'imgaes'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("a refused kind has %d limit rows (%v)", n, err)
	}
	// -new-kind sets a kind before its first task; from then on it is known.
	if code, _, errOut := o.run(t, "pause", "audio", "-new-kind"); code != 0 {
		t.Fatalf("pause audio -new-kind: exit %d: %s", code, errOut)
	}
	if code, _, errOut := o.run(t, "resume", "audio"); code != 0 {
		t.Fatalf("resume audio after -new-kind: exit %d: %s", code, errOut)
	}
}

// A limit flag with trailing garbage must be refused, not read up to the
// garbage: "-starts-per-second 0,5" (a decimal comma) read as 0 removes
// the rate limit, silently, during the outage the operator is managing.
func TestTasksLimitFlagsRefuseTrailingGarbage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newOpsBench(t)
	set := pgstore.KindLimits{MaxRunning: 4, StartsPerSecond: 2}
	for _, args := range [][]string{
		{"limits", "images", "-starts-per-second", "0,5"},
		{"limits", "images", "-max-running", "8abc"},
		{"limits", "images", "-max-running", "1e3"},
		{"limits", "images", "-max-running-per-tenant", "2 3"},
	} {
		if err := o.Store.SetKindLimits(ctx, "images", set); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := o.run(t, args...)
		got, _ := o.Store.KindLimits(ctx, "images")
		if code == 0 || got != set {
			t.Errorf("tasks %q: exit %d, limits now %+v (were %+v)\nstdout %s\nstderr %s", args, code, got, set, out, errOut)
		}
	}
}

// The stored tenant is keyspace's normalized segment; an operator types
// the tenant as the customer spells it. A filter that matches nothing
// must not look like "this tenant has no tasks".
func TestTasksListTenantAsSpelled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newOpsBench(t)
	raw := "Acme Corp"
	seg := keyspace.NormalizeSegment(raw)
	if _, err := o.Store.Submit(ctx, pgstore.NewTask{Tenant: seg, Owner: "owner", Kind: "images",
		Runtime: "runtime", Network: "network", IdempotencyKey: "raw-seg", Fingerprint: "v1:fp",
		Params: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if rows := o.rows(t, "list", "-tenant", seg); len(rows) != 1 {
		t.Fatalf("list -tenant %q: %d rows; want 1", seg, len(rows))
	}
	code, out, errOut := o.run(t, "list", "-tenant", raw)
	if code != 0 || !strings.Contains(out, seg) || !strings.Contains(errOut, seg) {
		t.Errorf("list -tenant %q (the raw tenant, stored as %q): exit %d, want its task and a note:\n%s%s", raw, seg, code, out, errOut)
	}
}

// -json output is valid JSON for every command, flags before or after the
// operand.
func TestTasksJSONOutputIsValid(t *testing.T) {
	t.Parallel()
	o := newOpsBench(t)
	for _, args := range [][]string{
		{"list", "-json"}, {"show", o.IDs[0], "-json"}, {"show", "-json", o.IDs[0]},
		{"limits", "images", "-json"}, {"limits", "-json", "images", "-max-running", "3"},
		{"pause", "images", "-json"}, {"resume", "-json", "images"}, {"cancel", o.IDs[2], "-json", "-yes"},
	} {
		code, out, errOut := o.run(t, args...)
		if code != 0 {
			t.Errorf("tasks %q: exit %d: %s", args, code, errOut)
			continue
		}
		if !json.Valid([]byte(out)) {
			t.Errorf("tasks %q: not JSON: %s", args, out)
		}
	}
}

// -json may come before the command ("tasks -json list").
func TestTasksJSONBeforeCommand(t *testing.T) {
	t.Parallel()
	o := newOpsBench(t)
	code, out, errOut := o.run(t, "-json", "list")
	if code != 0 || !json.Valid([]byte(out)) {
		t.Errorf("tasks -json list: exit %d: %s", code, strings.SplitN(errOut, "\n", 2)[0])
	}
}

// tasks limits' RUNNING (JSON "running") is what the limits count, the
// attempts holding a slot (pgstore.Stats.Attempts), not the tasks stored
// as running: an expired lease no rescue has taken back yet frees its
// slot, and a cancelled attempt holds its slot until its handler stopped.
func TestTasksLimitsRunningIsTheAttemptsTheLimitsCount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newOpsBench(t)
	// acme's images task: a lease that ended; globex's images task: a live
	// attempt, then cancelled while its handler still runs.
	if _, err := o.Pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'running', attempt = 1,
	lease_until = now() - interval '1 minute' WHERE id = $1::uuid`, o.IDs[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'running', attempt = 1,
	lease_until = now() + interval '1 minute' WHERE id = $1::uuid`, o.IDs[2]); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Store.Operator().Cancel(ctx, o.IDs[2]); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := o.run(t, "limits", "images", "-json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var row limitsRow
	if err := json.Unmarshal([]byte(out), &row); err != nil {
		t.Fatal(err)
	}
	if row.Running != 1 {
		t.Errorf("running = %d, want 1: the cancelled attempt still holds its slot, the expired lease does not", row.Running)
	}
}
