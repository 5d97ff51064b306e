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
	Machine     machine   `json:"machine"`
	Duration    string    `json:"duration_per_run"`
	Rounds      int       `json:"rounds"`
	Concurrency int       `json:"concurrency"`
	Slow        string    `json:"dup_handler_latency"`
	DupGroup    int       `json:"dup_group"`
	Results     []*result `json:"results"`
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
}

// result is one scenario on one stack.
type result struct {
	Scenario        string  `json:"scenario"`
	Stack           string  `json:"stack"`
	Requests        int64   `json:"requests"`
	TransportErrors int64   `json:"transport_errors"`
	Seconds         float64 `json:"seconds"`
	ReqPerSec       float64 `json:"req_per_sec"`
	RatioToFloor    float64 `json:"ratio_to_floor,omitempty"`
	P50ms           float64 `json:"p50_ms"`
	P99ms           float64 `json:"p99_ms"`
	P999ms          float64 `json:"p99_9_ms"`
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
	// RedisCPUusPerReq is INFO cpu (used_cpu_sys + used_cpu_user) over the
	// measured rounds, per request, in microseconds.
	RedisCPUusPerReq float64 `json:"redis_cpu_us_per_req"`
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
	fmt.Fprintf(w, "%s per scenario and stack in %d alternating rounds, %d keep-alive clients; dup: groups of %d on a %s handler\n\n",
		r.Duration, r.Rounds, r.Concurrency, r.DupGroup, r.Slow)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tstack\treq/s\tvs floor\tp50 ms\tp99 ms\tp99.9 ms\texecs\tdup execs\tredis rt/req\tINFO: scripts/req\tcmds/req\tredis µs/req\tB/record\trows/key\tstatus\t")
	for _, res := range r.Results {
		ratio := "-"
		if res.RatioToFloor > 0 {
			ratio = fmt.Sprintf("%.2f", res.RatioToFloor)
		}
		scripts := 0.0
		for _, cmd := range []string{"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"} {
			scripts += res.RedisCommands[cmd]
		}
		perRecord := "-"
		if res.RedisBytesPerRecord > 0 {
			perRecord = fmt.Sprintf("%.0f", res.RedisBytesPerRecord)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%.2f\t%.2f\t%.2f\t%d\t%d\t%.2f\t%.2f\t%.2f\t%.1f\t%s\t%.2f\t%s\t\n",
			res.Scenario, res.Stack, res.ReqPerSec, ratio, res.P50ms, res.P99ms, res.P999ms,
			res.HandlerExecutions, res.DuplicateExecutions, res.RedisRoundTripsPerReq, scripts,
			res.RedisCallsPerReq, res.RedisCPUusPerReq, perRecord, res.RowsPerAcceptedKey, statusLine(res))
	}
	tw.Flush()
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
