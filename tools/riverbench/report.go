package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// machine is what the table says about where it ran.
type machine struct {
	loadBefore, loadAfter string
	took                  time.Duration
	server                string
	quick                 bool
}

// loadAverage is the first three fields of /proc/loadavg, or "?".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// cpuModel is the first model name in /proc/cpuinfo, or "".
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// riverVersion is the River module version built in.
func riverVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/riverqueue/river" {
				return d.Version
			}
		}
	}
	return "?"
}

// report prints the table.
func report(w io.Writer, res *results, size sizes, m machine) {
	mode := "full"
	if m.quick {
		mode = "quick"
	}
	fmt.Fprintf(w, "\npgstore vs River %s (riverpgxv5), PostgreSQL %s, %s run of %v\n",
		riverVersion(), m.server, mode, m.took.Round(time.Second))
	fmt.Fprintf(w, "machine: %d cores (%s), %s %s/%s; load average %s before, %s after\n",
		runtime.NumCPU(), cpuModel(), runtime.Version(), runtime.GOOS, runtime.GOARCH, m.loadBefore, m.loadAfter)
	fmt.Fprintf(w, "River tuned: FetchCooldown %v, FetchPollInterval %v; defaults: 100ms, 1s. Every River insert is UniqueOpts{ByArgs: true}.\n\n",
		tunedFetchCooldown, tunedFetchPollInterval)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "row\tpgstore\tRiver tuned\tRiver default\tvs tuned\tmedian round\tvs default\t")
	rateRow := func(label, key string) {
		byS := res.rates[key]
		if byS == nil {
			return
		}
		p, t, d := byS[sysPgstore].perSecond(), byS[sysRiverTuned].perSecond(), byS[sysRiverDefault].perSecond()
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%s\t%s\t%s\t\n", label, p, t, d, ratio(p, t),
			medianRatio(res.rounds[key][sysPgstore], res.rounds[key][sysRiverTuned]), ratio(p, d))
	}
	rateRow(fmt.Sprintf("insert, new key (tasks/s, %d clients)", size.Clients), rowInsert)
	rateRow(fmt.Sprintf("insert, duplicate key (tasks/s, %d clients)", size.Clients), rowDup)
	rateRow(fmt.Sprintf("batch insert ×%d (tasks/s, %d clients)", size.BatchSize, size.BatchClients), rowBatch)
	rateRow(fmt.Sprintf("work, 1 process × %d (tasks/s)", size.Slots), workRow(1))
	rateRow(fmt.Sprintf("work, 2 processes × %d (tasks/s)", size.Slots), workRow(2))
	rateRow(fmt.Sprintf("drain a backlog, 1 process × %d (tasks/s)", size.Slots), drainRow(1))
	rateRow(fmt.Sprintf("drain a backlog, 2 processes × %d (tasks/s)", size.Slots), drainRow(2))
	if len(res.latency) > 0 {
		var p50, p99 [3]time.Duration
		for i, sys := range systems() {
			p50[i], p99[i] = percentiles(res.latency[sys])
		}
		ms := func(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }
		fmt.Fprintf(tw, "pickup latency p50 (ms, %d samples)\t%s\t%s\t%s\t%s\t-\t%s\t\n", len(res.latency[sysPgstore]),
			ms(p50[0]), ms(p50[1]), ms(p50[2]), ratio(p50[1].Seconds(), p50[0].Seconds()), ratio(p50[2].Seconds(), p50[0].Seconds()))
		fmt.Fprintf(tw, "pickup latency p99 (ms)\t%s\t%s\t%s\t%s\t-\t%s\t\n",
			ms(p99[0]), ms(p99[1]), ms(p99[2]), ratio(p99[1].Seconds(), p99[0].Seconds()), ratio(p99[2].Seconds(), p99[0].Seconds()))
	}
	tw.Flush()
	fmt.Fprintln(w, "\nvs: how many times better pgstore is (pgstore ÷ River for rates, River ÷ pgstore for latencies); ≥ 1.00 means pgstore is ahead.")
	fmt.Fprintln(w, "median round: the median of the rounds' ratios to River tuned, each round against River tuned's round beside it (rounds alternate), which one slow round moves less.")
	fmt.Fprintf(w, "batch insert: pgstore uses %s; River InsertMany.\n", batchMode())
	fmt.Fprintf(w, "work: from the first submit until the database shows every task completed; %d tasks per round (%d for River at its defaults), %d rounds.\n",
		size.WorkTasks, size.WorkTasksSlow, size.WorkRounds)
	fmt.Fprintf(w, "drain: the same tasks submitted in one batch before the clock starts; from then until all completed.\n")
	keys := []string{rowInsert, rowDup, rowBatch, workRow(1), workRow(2), drainRow(1), drainRow(2)}
	fmt.Fprintf(w, "\ncost per task: round trips submitting + working (queries, batches, COPYs on the pools);\n")
	fmt.Fprintf(w, "CPU µs of the PostgreSQL server while timed; CPU µs of the worker processes, start to exit:\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "row\tpgstore trips\tserver\tworker\ttuned trips\tserver\tworker\tdefault trips\tserver\tworker\t")
	for _, key := range keys {
		if res.trips[key] == nil {
			continue
		}
		fmt.Fprintf(tw, "%s\t", key)
		for _, sys := range systems() {
			t := res.trips[key][sys]
			if t.tasks == 0 {
				fmt.Fprint(tw, "-\t-\t-\t")
				continue
			}
			per := func(d time.Duration) string {
				if d == 0 {
					return "-"
				}
				return fmt.Sprintf("%.0f", float64(d.Microseconds())/float64(t.tasks))
			}
			fmt.Fprintf(tw, "%.2f + %.2f\t%s\t%s\t", float64(t.submit)/float64(t.tasks), float64(t.worker)/float64(t.tasks),
				per(t.serverCPU), per(t.workerCPU))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	fmt.Fprintf(w, "per-round rates (tasks/s), in round order:\n")
	for _, key := range keys {
		if res.rounds[key] == nil {
			continue
		}
		fmt.Fprintf(w, "  %-7s", key)
		for _, sys := range systems() {
			fmt.Fprintf(w, "  %s:", sys)
			for _, v := range res.rounds[key][sys] {
				fmt.Fprintf(w, " %.0f", v)
			}
		}
		fmt.Fprintln(w)
	}
}

// medianRatio is the median of a[i]/b[i], formatted, or "-" without
// rounds.
func medianRatio(a, b []float64) string {
	var rs []float64
	for i := range min(len(a), len(b)) {
		if b[i] > 0 {
			rs = append(rs, a[i]/b[i])
		}
	}
	if len(rs) == 0 {
		return "-"
	}
	slices.Sort(rs)
	m := rs[len(rs)/2]
	if len(rs)%2 == 0 {
		m = (rs[len(rs)/2-1] + m) / 2
	}
	return fmt.Sprintf("%.2f×", m)
}

// ratio is a/b formatted, or "-" when b is zero.
func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", a/b)
}
