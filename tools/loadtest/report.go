package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// report is the whole run, as printed by -json.
type report struct {
	Machine     machine `json:"machine"`
	Duration    string  `json:"duration_per_run"`
	Rounds      int     `json:"rounds"`
	Concurrency int     `json:"concurrency"`
	Slow        string  `json:"dup_handler_latency"`
	DupGroup    int     `json:"dup_group"`
	// PGWrite is -pg-write: the handler's write on idemgate-pg and
	// idemgate-pg-atomic (task or ledger).
	PGWrite string    `json:"pg_write"`
	Results []*result `json:"results"`
}

type machine struct {
	GOOS       string `json:"goos"`
	GOARCH     string `json:"goarch"`
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	Go         string `json:"go"`
	Redis      string `json:"redis"`
	Postgres   string `json:"postgres"`
	// LoadAvgStart and LoadAvgEnd are the 1-minute load average when the
	// run began and ended (Linux).
	LoadAvgStart string `json:"loadavg_start,omitempty"`
	LoadAvgEnd   string `json:"loadavg_end,omitempty"`
	// PostgresCPU says whether Postgres CPU was measured: only for a
	// server on this machine (internal/pgcpu).
	PostgresCPU bool `json:"postgres_cpu_measured"`
}

// result is one scenario on one stack.
type result struct {
	Scenario string `json:"scenario"`
	Stack    string `json:"stack"`
	// Records is where the stack keeps idempotency records: redis or
	// postgres. Floor is the stack RatioToFloor compares to (none for a
	// floor): floor for the Redis stacks, pg-floor for idemgate-pg.
	Records         string  `json:"records"`
	Floor           string  `json:"floor,omitempty"`
	Requests        int64   `json:"requests"`
	TransportErrors int64   `json:"transport_errors"`
	Seconds         float64 `json:"seconds"`
	ReqPerSec       float64 `json:"req_per_sec"`
	RatioToFloor    float64 `json:"ratio_to_floor,omitempty"`
	// RatioMedian is the median over the rounds of the round's req/s to
	// the floor's in the same round; RatioMin and RatioMax the spread.
	RatioMedian float64 `json:"ratio_to_floor_median_of_rounds,omitempty"`
	RatioMin    float64 `json:"ratio_to_floor_min_round,omitempty"`
	RatioMax    float64 `json:"ratio_to_floor_max_round,omitempty"`
	P50ms       float64 `json:"p50_ms"`
	P99ms       float64 `json:"p99_ms"`
	P999ms      float64 `json:"p99_9_ms"`
	// Status counts responses by HTTP status code.
	Status map[string]int64 `json:"status"`
	// HandlerExecutions counts handler runs while measured; a duplicate
	// execution is a second run for the same key.
	HandlerExecutions   int64 `json:"handler_executions"`
	DuplicateExecutions int64 `json:"duplicate_executions"`
	RowsCreated         int64 `json:"rows_created"`
	// RedisRoundTripsPerReq counts what the stack's client sent (a script
	// call is one); RedisCallsPerReq is the INFO commandstats delta, which
	// also counts the commands a script runs inside Redis.
	RedisRoundTripsPerReq float64            `json:"redis_round_trips_per_req"`
	RedisCallsPerReq      float64            `json:"redis_calls_per_req"`
	RedisCommands         map[string]float64 `json:"redis_commands_per_req"`
	// RedisUsec is INFO commandstats' time per call of each command, in
	// microseconds (a script's includes the commands it runs, which are
	// also counted on their own).
	RedisUsec map[string]float64 `json:"redis_usec_per_call"`
	// RedisCPUusPerReq is INFO cpu (used_cpu_sys + used_cpu_user) over the
	// measured rounds, per request, in microseconds.
	RedisCPUusPerReq float64 `json:"redis_cpu_us_per_req"`
	// PGRoundTripsPerReq counts the statements the stack's records pool
	// sent (Postgres stacks only; the task work has a pool of its own).
	PGRoundTripsPerReq float64 `json:"pg_round_trips_per_req"`
	// PGCPUusPerReq is the user+system CPU time of every process of the
	// Postgres server over the measured rounds, per request, in
	// microseconds (see machine.PostgresCPU). It includes
	// the task work, the same for every stack.
	PGCPUusPerReq float64 `json:"pg_cpu_us_per_req,omitempty"`
	// ProcessCPUusPerReq is this process's CPU time (the load tool's
	// clients and every stack's server, Go side) over the measured rounds,
	// per request, in microseconds: the clients cost the same for every
	// stack, so a difference between two stacks is their handlers'.
	ProcessCPUusPerReq float64 `json:"process_cpu_us_per_req"`
	// RedisBytesPerRecord is the used_memory delta over the DBSIZE delta of
	// the measured rounds (miss scenario; 0 when no key was added).
	RedisBytesPerRecord float64 `json:"redis_bytes_per_record,omitempty"`
	// AcceptedKeys are keys that got a 2xx (seeded ones included); Rows are
	// the rows of this scenario's tenant.
	AcceptedKeys       int64   `json:"accepted_keys"`
	Rows               int64   `json:"rows"`
	DuplicateRows      int64   `json:"duplicate_rows"`
	RowsPerAcceptedKey float64 `json:"rows_per_accepted_key"`
	TaskIDMismatches   int64   `json:"task_id_mismatches"`
	// Rounds are the figures of each round, in the order run.
	Rounds []round `json:"rounds,omitempty"`
}

func (r report) writeTable(w io.Writer) {
	m := r.Machine
	fmt.Fprintf(w, "\n%d CPUs (GOMAXPROCS %d), %s/%s, %s, redis %s, postgres %s, load average %s → %s\n",
		m.CPUs, m.GOMAXPROCS, m.GOOS, m.GOARCH, m.Go, m.Redis, m.Postgres, m.LoadAvgStart, m.LoadAvgEnd)
	fmt.Fprintf(w, "%s per scenario and stack in %d alternating rounds, %d keep-alive clients; dup: groups of %d on a %s handler\n",
		r.Duration, r.Rounds, r.Concurrency, r.DupGroup, r.Slow)
	if r.PGWrite == pgWriteLedger {
		fmt.Fprintf(w, "handler write (-pg-write %s): one INSERT into %s, in %s's transaction and in autocommit on %s's records pool\n\n",
			pgWriteLedger, ledgerTable, idemgatePGAtomicName, idemgatePGName)
	} else {
		fmt.Fprint(w, "\n")
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tstack\treq/s\tvs floor\tp50 ms\tp99 ms\tp99.9 ms\texecs\tdup execs\tredis rt/req\tINFO: scripts/req\tscript µs/call\tcmds/req\tredis µs/req\tpg rt/req\tpg µs/req\tgo µs/req\tB/record\trows/key\tstatus\t")
	for _, res := range r.Results {
		ratio := "-"
		if res.RatioToFloor > 0 {
			ratio = fmt.Sprintf("%.2f", res.RatioToFloor)
		}
		scripts, scriptUsec := 0.0, 0.0
		for _, cmd := range []string{"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"} {
			scripts += res.RedisCommands[cmd]
			scriptUsec += res.RedisCommands[cmd] * res.RedisUsec[cmd]
		}
		perScript := "-"
		if scripts > 0 {
			perScript = fmt.Sprintf("%.1f", scriptUsec/scripts)
		}
		perRecord := "-"
		if res.RedisBytesPerRecord > 0 {
			perRecord = fmt.Sprintf("%.0f", res.RedisBytesPerRecord)
		}
		pgRT, pgCPU := "-", "-"
		if res.Records == "postgres" {
			pgRT = fmt.Sprintf("%.2f", res.PGRoundTripsPerReq)
		}
		if r.Machine.PostgresCPU {
			pgCPU = fmt.Sprintf("%.1f", res.PGCPUusPerReq)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%.2f\t%.2f\t%.2f\t%d\t%d\t%.2f\t%.2f\t%s\t%.2f\t%.1f\t%s\t%s\t%.1f\t%s\t%.2f\t%s\t\n",
			res.Scenario, res.Stack, res.ReqPerSec, ratio, res.P50ms, res.P99ms, res.P999ms,
			res.HandlerExecutions, res.DuplicateExecutions, res.RedisRoundTripsPerReq, scripts, perScript,
			res.RedisCallsPerReq, res.RedisCPUusPerReq, pgRT, pgCPU, res.ProcessCPUusPerReq, perRecord, res.RowsPerAcceptedKey, statusLine(res))
	}
	tw.Flush()
	if lines := r.ratioLines(); len(lines) > 0 {
		work := "task work"
		if r.PGWrite == pgWriteLedger {
			work = "the ledger INSERT"
		}
		fmt.Fprintf(w, "\nreq/s relative to the floor, same rounds (pg µs/req is the whole server's, %s included; go µs/req this process's, clients included):\n", work)
		for _, l := range lines {
			fmt.Fprintln(w, "  "+l)
		}
	}
}

// ratioLines says, per stack that has a floor, its ratio to that floor in
// each scenario: "idemgate-pg ÷ pg-floor: miss 0.93×, replay 0.97×".
func (r report) ratioLines() []string {
	var (
		order []string
		parts = map[string][]string{}
	)
	for _, res := range r.Results {
		if res.RatioToFloor <= 0 {
			continue
		}
		name := res.Stack + " ÷ " + res.Floor
		if _, ok := parts[name]; !ok {
			order = append(order, name)
		}
		parts[name] = append(parts[name], fmt.Sprintf("%s %.2f× (median of rounds %.2f×, %.2f–%.2f)",
			res.Scenario, res.RatioToFloor, res.RatioMedian, res.RatioMin, res.RatioMax))
	}
	lines := make([]string, len(order))
	for i, name := range order {
		lines[i] = name + ": " + strings.Join(parts[name], ", ")
	}
	return lines
}

func statusLine(res *result) string {
	codes := make([]string, 0, len(res.Status))
	for c := range res.Status {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	parts := make([]string, 0, len(codes)+1)
	for _, c := range codes {
		parts = append(parts, fmt.Sprintf("%s:%d", c, res.Status[c]))
	}
	if res.TransportErrors > 0 {
		parts = append(parts, fmt.Sprintf("err:%d", res.TransportErrors))
	}
	if res.TaskIDMismatches > 0 {
		parts = append(parts, fmt.Sprintf("MISMATCH:%d", res.TaskIDMismatches))
	}
	return strings.Join(parts, " ")
}
