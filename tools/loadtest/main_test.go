package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// TestRun runs every scenario briefly against real servers and checks what
// the tool reports that does not depend on speed: round trips per request,
// executions, rows and status codes.
func TestRun(t *testing.T) {
	ro := testenv.Redis(t)
	dsn := testenv.PostgresDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, log bytes.Buffer
	err := run(ctx, []string{
		"-duration", "300ms", "-warmup", "200ms", "-concurrency", "4", "-dup-group", "2",
		"-keys", "16", "-slow", "20ms", "-pg-conns", "4", "-json",
		"-redis-url", fmt.Sprintf("redis://%s/%d", ro.Addr, ro.DB), "-database-url", dsn,
	}, &out, &log)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("decode -json output: %v\n%s", err, out.String())
	}
	// Round trips to the records store: Redis for the Redis stacks,
	// the records pool for the Postgres stacks; none to the other.
	wantRT := map[string]float64{"miss": 2, "replay": 1, "conflict": 1}
	wantStatus := map[string][]string{"miss": {"202"}, "replay": {"202"}, "conflict": {"409"}, "dup": {"202", "409"}}
	wantFloor := map[string]string{floorName: "", floorScriptName: floorName, idemgateName: floorName, idemgateHTTPName: floorName,
		pgFloorName: "", idemgatePGName: pgFloorName, idemgatePGAtomicName: idemgatePGName}
	// The Atomic stack's records pool carries its task statements too: a
	// miss is the claim; BEGIN with its SET LOCAL; SAVEPOINT (SubmitTx's);
	// the task's INSERT; RELEASE; the completion with COMMIT. A replay or
	// a conflict opens no transaction. SubmitTx also lists its task's line
	// (pgstore v9) once a line every 20 s: one round trip more for the
	// scenario's one tenant, once for each of the 4 clients that race to
	// its first listing in a run this short.
	wantAtomicRT := map[string]float64{"miss": 6, "replay": 1, "conflict": 1}
	if len(rep.Results) != 4*len(stackOrder) {
		t.Fatalf("%d results, want 4 scenarios × %d stacks %v", len(rep.Results), len(stackOrder), stackOrder)
	}
	for i, res := range rep.Results {
		name := res.Scenario + "/" + res.Stack
		if want := stackOrder[i%len(stackOrder)]; res.Stack != want {
			t.Errorf("result %d is %s, want stack %s (stacks in stackOrder)", i, name, want)
		}
		if res.Floor != wantFloor[res.Stack] || (res.Floor != "") != (res.RatioToFloor > 0) {
			t.Errorf("%s: ratio %.2f to floor %q, want a ratio to %q", name, res.RatioToFloor, res.Floor, wantFloor[res.Stack])
		}
		redisRT, pgRT := res.RedisRoundTripsPerReq, res.PGRoundTripsPerReq
		if res.Records == "postgres" {
			redisRT, pgRT = pgRT, redisRT
		}
		want, ok := wantRT[res.Scenario]
		extra := 0.0 // round trips allowed beyond want, per request
		if res.Stack == idemgatePGAtomicName {
			want, ok = wantAtomicRT[res.Scenario]
			if res.Scenario == "miss" && res.Requests > 0 {
				extra = 4 / float64(res.Requests)
			}
		}
		if ok && (redisRT < want-1e-9 || redisRT > want+extra+1e-9 || pgRT != 0) {
			t.Errorf("%s: %.3f round trips per request to its %s records store (want %v, %d requests), %.3f to the other (want 0)",
				name, redisRT, res.Records, want, res.Requests, pgRT)
		}
		if res.Requests == 0 || res.TransportErrors != 0 {
			t.Errorf("%s: %d requests, %d transport errors", name, res.Requests, res.TransportErrors)
		}
		if res.DuplicateExecutions != 0 || res.DuplicateRows != 0 || res.TaskIDMismatches != 0 {
			t.Errorf("%s: %d duplicate executions, %d duplicate rows, %d task id mismatches",
				name, res.DuplicateExecutions, res.DuplicateRows, res.TaskIDMismatches)
		}
		if res.RowsPerAcceptedKey != 1 {
			t.Errorf("%s: %.3f rows per accepted key, want 1", name, res.RowsPerAcceptedKey)
		}
		for code := range res.Status {
			if !contains(wantStatus[res.Scenario], code) {
				t.Errorf("%s: status %s (%d times), want only %v", name, code, res.Status[code], wantStatus[res.Scenario])
			}
		}
	}
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	var left int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM idemgate_tasks`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("after the run: %d tasks left, want every stack's removed", left)
	}
	var records int
	var floorTable *string
	if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM idemgate_records), to_regclass($1)::text`, pgFloorTable).Scan(&records, &floorTable); err != nil {
		t.Fatal(err)
	}
	if records != 0 || floorTable != nil {
		t.Errorf("after the run: %d idemgate-pg records left and the pg-floor's table %v, want neither", records, floorTable)
	}
	wantCalls := map[string]map[string]float64{
		floorName:        {"miss": 2, "replay": 1, "conflict": 1},
		floorScriptName:  {"miss": 4, "replay": 2, "conflict": 2},
		idemgateName:     {"miss": 4, "replay": 1, "conflict": 1},
		idemgateHTTPName: {"miss": 4, "replay": 1, "conflict": 1},
	}
	for _, res := range rep.Results {
		if res.Scenario == "miss" && res.HandlerExecutions != res.Requests {
			t.Errorf("miss/%s: %d executions for %d requests of new keys", res.Stack, res.HandlerExecutions, res.Requests)
		}
		if (res.Scenario == "replay" || res.Scenario == "conflict") && res.HandlerExecutions != 0 {
			t.Errorf("%s/%s: the handler ran %d times", res.Scenario, res.Stack, res.HandlerExecutions)
		}
		if res.ProcessCPUusPerReq <= 0 {
			t.Errorf("%s/%s: this process's CPU per request %v, want > 0", res.Scenario, res.Stack, res.ProcessCPUusPerReq)
		}
		if res.Records == "redis" && res.RedisCPUusPerReq <= 0 {
			t.Errorf("%s/%s: Redis CPU per request %v, want > 0", res.Scenario, res.Stack, res.RedisCPUusPerReq)
		}
		// INFO commandstats' commands per request (a script's inner
		// commands counted), as docs/performance.md's sample output and
		// its cluster table give them. Under -race a miss made 4.097
		// (slower requests sending more; a lease renewal, most likely),
		// so up to half a command more: a path that gains or loses a
		// command a request still fails.
		if want, ok := wantCalls[res.Stack][res.Scenario]; ok {
			if got := res.RedisCallsPerReq; got < want-1e-9 || got >= want+0.5 {
				t.Errorf("%s/%s: %.3f Redis commands per request in INFO, want %v", res.Scenario, res.Stack, got, want)
			}
		}
		// Every miss writes to Postgres (the task, and for the Postgres
		// stacks the record) on this machine's server.
		if res.Scenario == "miss" && testenv.PostgresServer(t) != nil && res.PGCPUusPerReq <= 0 {
			t.Errorf("miss/%s: Postgres CPU per request %v, want > 0", res.Stack, res.PGCPUusPerReq)
		}
	}
}

// TestRunLedger runs every scenario briefly with -pg-write ledger: the
// two stacks it compares, one ledger INSERT per new key on each (the
// Atomic miss costs the plain miss's 3 round trips on the records pool: the
// claim, BEGIN and SET LOCAL sent with the INSERT, the completion sent
// with COMMIT), one ledger row per accepted key, none added by a replay or
// a conflict, and the table the tool made dropped at the end.
func TestRunLedger(t *testing.T) {
	ro := testenv.Redis(t)
	dsn := testenv.PostgresDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, log bytes.Buffer
	err := run(ctx, []string{
		"-duration", "300ms", "-warmup", "200ms", "-concurrency", "4", "-dup-group", "2",
		"-keys", "16", "-slow", "20ms", "-pg-conns", "4", "-json", "-pg-write", "ledger",
		"-redis-url", fmt.Sprintf("redis://%s/%d", ro.Addr, ro.DB), "-database-url", dsn,
	}, &out, &log)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("decode -json output: %v\n%s", err, out.String())
	}
	if rep.PGWrite != pgWriteLedger {
		t.Errorf("report says pg_write %q, want %q", rep.PGWrite, pgWriteLedger)
	}
	stacks := []string{idemgatePGName, idemgatePGAtomicName}
	if len(rep.Results) != 4*len(stacks) {
		t.Fatalf("%d results, want 4 scenarios × %v", len(rep.Results), stacks)
	}
	wantRT := map[string]float64{"miss": 3, "replay": 1, "conflict": 1}
	wantStatus := map[string][]string{"miss": {"202"}, "replay": {"202"}, "conflict": {"409"}, "dup": {"202", "409"}}
	for i, res := range rep.Results {
		name := res.Scenario + "/" + res.Stack
		if want := stacks[i%len(stacks)]; res.Stack != want {
			t.Errorf("result %d is %s, want stack %s", i, name, want)
		}
		switch {
		case res.Stack == idemgatePGAtomicName && (res.Floor != idemgatePGName || res.RatioToFloor <= 0):
			t.Errorf("%s: ratio %.2f to %q, want a ratio to %s", name, res.RatioToFloor, res.Floor, idemgatePGName)
		case res.Stack == idemgatePGName && res.RatioToFloor != 0:
			t.Errorf("%s: ratio %.2f to %q, whose floor did not run", name, res.RatioToFloor, res.Floor)
		}
		if want, ok := wantRT[res.Scenario]; ok && (math.Abs(res.PGRoundTripsPerReq-want) > 1e-9 || res.RedisRoundTripsPerReq != 0) {
			t.Errorf("%s: %.3f Postgres round trips per request on the records pool (want %v), %.3f to Redis (want 0)",
				name, res.PGRoundTripsPerReq, want, res.RedisRoundTripsPerReq)
		}
		if res.Requests == 0 || res.TransportErrors != 0 {
			t.Errorf("%s: %d requests, %d transport errors", name, res.Requests, res.TransportErrors)
		}
		if res.DuplicateExecutions != 0 || res.DuplicateRows != 0 || res.TaskIDMismatches != 0 {
			t.Errorf("%s: %d duplicate executions, %d duplicate rows, %d entry id mismatches",
				name, res.DuplicateExecutions, res.DuplicateRows, res.TaskIDMismatches)
		}
		if res.RowsPerAcceptedKey != 1 {
			t.Errorf("%s: %.3f ledger rows per accepted key (%d rows, %d keys), want 1", name, res.RowsPerAcceptedKey, res.Rows, res.AcceptedKeys)
		}
		for code := range res.Status {
			if !contains(wantStatus[res.Scenario], code) {
				t.Errorf("%s: status %s (%d times), want only %v", name, code, res.Status[code], wantStatus[res.Scenario])
			}
		}
		switch res.Scenario {
		case "miss":
			if res.HandlerExecutions != res.Requests || res.RowsCreated != res.Requests || res.Rows != res.Requests {
				t.Errorf("%s: %d executions, %d rows written, %d in the ledger for %d requests of new keys",
					name, res.HandlerExecutions, res.RowsCreated, res.Rows, res.Requests)
			}
			if testenv.PostgresServer(t) != nil && res.PGCPUusPerReq <= 0 {
				t.Errorf("%s: Postgres CPU per request %v, want > 0", name, res.PGCPUusPerReq)
			}
		case "replay", "conflict":
			// The seeding wrote the keys' rows; the measured requests none.
			if res.HandlerExecutions != 0 || res.RowsCreated != 0 || res.Rows != 16 {
				t.Errorf("%s: %d executions, %d rows written, %d in the ledger for the 16 seeded keys",
					name, res.HandlerExecutions, res.RowsCreated, res.Rows)
			}
		}
	}
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	var records int
	var ledger *string
	if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM idemgate_records), to_regclass($1)::text`, ledgerTable).Scan(&records, &ledger); err != nil {
		t.Fatal(err)
	}
	if records != 0 || ledger != nil {
		t.Errorf("after the run: %d records left and the ledger table %v, want neither", records, ledger)
	}

	// The table says which write was measured, and gives both stacks' pg
	// round trips and CPU and the Atomic stack's ratio to the plain one.
	var table bytes.Buffer
	rep.writeTable(&table)
	for _, want := range []string{"-pg-write ledger", "pg rt/req", "pg µs/req", idemgatePGAtomicName + " ÷ " + idemgatePGName + ": miss "} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("the table does not say %q:\n%s", want, table.String())
		}
	}
}

// TestRunCluster runs the Redis stacks on a cluster the tool starts: the
// same round trips per request as on one server, every request answered,
// and the commands counted over every primary.
func TestRunCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Skip("redis-cli is not installed")
	}
	dsn := testenv.PostgresDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, log bytes.Buffer
	err := run(ctx, []string{
		"-duration", "300ms", "-rounds", "2", "-warmup", "100ms", "-concurrency", "4",
		"-dup-group", "2", "-keys", "16", "-pg-conns", "4", "-json", "-cluster", "3",
		"-stacks", "floor,floor-script,idemgate", "-scenarios", "miss,replay",
		"-database-url", dsn,
	}, &out, &log)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("decode -json output: %v\n%s", err, out.String())
	}
	if !strings.Contains(rep.Machine.Redis, "cluster of 3 primaries") {
		t.Errorf("redis %q, want it to say the cluster", rep.Machine.Redis)
	}
	wantRT := map[string]float64{"miss": 2, "replay": 1}
	if len(rep.Results) != 6 {
		t.Fatalf("%d results, want 2 scenarios × 3 stacks", len(rep.Results))
	}
	for _, res := range rep.Results {
		name := res.Scenario + "/" + res.Stack
		if res.Requests == 0 || res.TransportErrors != 0 || res.Status["202"] != res.Requests {
			t.Errorf("%s: %d requests, statuses %v, %d transport errors", name, res.Requests, res.Status, res.TransportErrors)
		}
		// A cluster client may send a command again (TRYAGAIN or
		// CLUSTERDOWN while a new cluster settles): a few in a thousand.
		if got, want := res.RedisRoundTripsPerReq, wantRT[res.Scenario]; got < want-1e-9 || got > want*1.02 {
			t.Errorf("%s: %.3f round trips per request, want %v (at most 2%% more)", name, got, want)
		}
		// Every request's commands, counted on whichever primary ran them.
		if res.RedisCallsPerReq < wantRT[res.Scenario] {
			t.Errorf("%s: %.2f commands per request in INFO over the primaries, want at least %v", name, res.RedisCallsPerReq, wantRT[res.Scenario])
		}
		if res.Stack != floorName && res.RatioToFloor <= 0 {
			t.Errorf("%s: no ratio to the floor", name)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestParseCommandStats(t *testing.T) {
	tests := []struct {
		name  string
		given string
		want  map[string]cmdStat
	}{
		{"empty", "# Commandstats\r\n", map[string]cmdStat{}},
		{"two commands", "# Commandstats\r\ncmdstat_evalsha:calls=3,usec=40,usec_per_call=13.33,rejected_calls=0,failed_calls=0\r\n" +
			"cmdstat_get:calls=12,usec=5,usec_per_call=0.42,rejected_calls=0,failed_calls=0\r\n",
			map[string]cmdStat{"evalsha": {3, 40}, "get": {12, 5}}},
		{"subcommand", "cmdstat_client|setinfo:calls=2,usec=1\r\n", map[string]cmdStat{"client|setinfo": {2, 1}}},
		{"other lines ignored", "redis_version:7.0.15\r\ncmdstat_set:calls=1\r\n", map[string]cmdStat{"set": {1, 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := parseCommandStats(tt.given)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("parseCommandStats = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestMedianRatio: the median of the rounds' ratios pairs each round of a
// stack with the same round of its floor.
func TestMedianRatio(t *testing.T) {
	rounds := func(rps ...float64) []round {
		out := make([]round, len(rps))
		for i, r := range rps {
			out[i] = round{Round: i + 1, ReqPerSec: r}
		}
		return out
	}
	floor := &result{Stack: floorName, Rounds: rounds(100, 200, 100, 50, 100)}
	st := &result{Stack: idemgateName, Floor: floorName, Rounds: rounds(90, 100, 95, 50, 120)}
	setRatios([]*result{floor, st})
	// 0.9, 0.5, 0.95, 1.0, 1.2: the median is 0.95.
	if st.RatioMedian != 0.95 || st.RatioMin != 0.5 || st.RatioMax != 1.2 {
		t.Errorf("median %v (%v–%v), want 0.95 (0.5–1.2)", st.RatioMedian, st.RatioMin, st.RatioMax)
	}
	if floor.RatioMedian != 0 {
		t.Errorf("a floor has a ratio %v", floor.RatioMedian)
	}
}

func TestTaskID(t *testing.T) {
	tests := []struct {
		name, given, want string
	}{
		{"present", `{"task_id":"0b1c","status":"pending"}`, "0b1c"},
		{"absent", `{"code":"key_reused"}`, ""},
		{"unterminated", `{"task_id":"0b1c`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := taskID([]byte(tt.given)); got != tt.want {
				t.Errorf("taskID(%s) = %q, want %q", tt.given, got, tt.want)
			}
		})
	}
}

func TestParseFlagsStacks(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		given   []string
		want    []string
		wantErr bool
	}{
		{name: "default: every stack", want: stackOrder},
		{name: "shown in stack order, each once", given: []string{"-stacks", "idemgate-pg, pg-floor,idemgate-pg"},
			want: []string{pgFloorName, idemgatePGName}},
		{name: "unknown", given: []string{"-stacks", "floor,pg"}, wantErr: true},
		{name: "empty", given: []string{"-stacks", ""}, wantErr: true},
		{name: "ledger: the two stacks it compares by default", given: []string{"-pg-write", "ledger"},
			want: []string{idemgatePGName, idemgatePGAtomicName}},
		{name: "ledger: one of them", given: []string{"-pg-write", "ledger", "-stacks", "idemgate-pg-atomic"},
			want: []string{idemgatePGAtomicName}},
		{name: "ledger refuses another stack", given: []string{"-pg-write", "ledger", "-stacks", "pg-floor,idemgate-pg,idemgate-pg-atomic"}, wantErr: true},
		{name: "task: every stack", given: []string{"-pg-write", "task"}, want: stackOrder},
		{name: "unknown write", given: []string{"-pg-write", "row"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseFlags(tt.given, io.Discard)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("parseFlags(%q) = stacks %v, want an error", tt.given, o.stacks)
				}
				return
			}
			if err != nil || !slices.Equal(o.stacks, tt.want) {
				t.Fatalf("parseFlags(%q) = stacks %v, %v; want %v", tt.given, o.stacks, err, tt.want)
			}
		})
	}
}
