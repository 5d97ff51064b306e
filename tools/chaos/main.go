// Command chaos is a randomized fault soak of the example service with a
// history checker, in the manner of Jepsen: real processes, random faults
// on a seeded schedule, every request and answer recorded, and invariants
// checked over the record.
//
//	go run ./tools/chaos -seed 1 -duration 60s          # a run; exit 0 iff every invariant holds
//	go run ./tools/chaos -seed 1 -duration 60s -store postgres   # records in Postgres: invariant 7 strict
//	go run ./tools/chaos -seed 1 -duration 30m -json    # the long run, as JSON
//	go run ./tools/chaos -policy images=retry           # the workers retry a lost attempt
//	go run ./tools/chaos -plant list                    # the bugs that can be planted
//	go run ./tools/chaos -plant replay-ignores-fingerprint -duration 20s
//	go run ./tools/chaos -check history.jsonl           # check a recorded history again
//
// The system: two API nodes (example serve) and two worker processes
// (example worker) on a throwaway PostgreSQL and a real redis-server (none
// with -store postgres: the records are in Postgres), all on loopback,
// each process's link to each server through a proxy the tool controls.
// Dozens of clients follow the client rules with the example's Go client;
// a nemesis kills, pauses, partitions, freezes, slows and flushes, and
// kills an API node right after an export it ran committed. When the
// fault window ends everything is healed, the clients finish their last
// action within -bound, and the checker reads the history. Every child
// process dies with the tool (Pdeathsig).
//
// Exit status: 0 when every invariant holds, 1 when one is violated (the run
// directory with the history and the processes' logs is kept and named), 2
// when the run could not be made.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/middleware"
)

// Route templates as the history names them.
const (
	routeSubmit  = "POST /v1/images"
	routeTask    = "GET /v1/tasks/{id}"
	routeCancel  = "POST /v1/tasks/{id}/cancel"
	routeExport  = "POST /v1/tasks/{id}/export"
	routeRecover = "POST /v1/tasks/{id}/recover"
)

// exportKind is the idempotency kind of the example's export route.
const exportKind = "export"

const (
	sigStop = syscall.SIGSTOP
	sigCont = syscall.SIGCONT
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	removeBuilds()
	os.Exit(code)
}

// options are the command line.
type options struct {
	seed     int64
	duration time.Duration
	bound    time.Duration
	clients  int
	asJSON   bool
	plant    string
	faults   string
	policy   string
	store    string
	genTime  time.Duration
	history  string
	keep     bool
	check    string
	root     string
	quiet    bool
}

func parseOptions(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Int64Var(&o.seed, "seed", 1, "seed of the fault schedule and the clients' choices")
	fs.DurationVar(&o.duration, "duration", 60*time.Second, "how long faults are injected while clients run")
	fs.DurationVar(&o.bound, "bound", 60*time.Second, "liveness bound: every client action ends this long after healing")
	fs.IntVar(&o.clients, "clients", 24, "concurrent clients")
	fs.BoolVar(&o.asJSON, "json", false, "print the report as JSON")
	fs.StringVar(&o.plant, "plant", "", `plant a known bug (needs its hook; "list" prints them)`)
	fs.StringVar(&o.faults, "faults", "all", "comma-separated fault kinds to inject, \"all\" or \"none\": "+strings.Join(faultKinds, ","))
	fs.StringVar(&o.policy, "policy", defaultPolicy, "what a lost attempt becomes per task kind, given to the workers (TASK_POLICY): kind=uncertain|retry,...")
	fs.StringVar(&o.store, "store", "redis", "where the API nodes keep idempotency records: redis, or postgres (STORE=postgres: the export route is Atomic and invariant 7 strict)")
	fs.DurationVar(&o.genTime, "gen-time", time.Second, "how long the stand-in generator takes per task")
	fs.StringVar(&o.history, "history", "", "write the history (JSON lines) here; default: in the run directory")
	fs.BoolVar(&o.keep, "keep", false, "keep the run directory (logs, history) even when every invariant holds")
	fs.StringVar(&o.check, "check", "", "check a recorded history file instead of running")
	fs.StringVar(&o.root, "root", "", "repository root to build the example from; default: the go.work's directory")
	fs.BoolVar(&o.quiet, "q", false, "no progress lines on stderr")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("chaos: unexpected argument %q", fs.Arg(0))
	}
	if o.store != "redis" && o.store != "postgres" {
		return o, fmt.Errorf("chaos: -store %q: want redis or postgres", o.store)
	}
	if o.duration <= 0 || o.bound <= 0 || o.clients <= 0 {
		return o, errors.New("chaos: -duration, -bound and -clients must be positive")
	}
	return o, nil
}

// defaultPolicy is the example's own: a lost image attempt becomes
// uncertain and is reconciled, never generated again.
const defaultPolicy = "images=uncertain"

// parsePolicy reads kind=policy pairs.
func parsePolicy(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		kind, pol, ok := strings.Cut(part, "=")
		if !ok || (pol != "uncertain" && pol != "retry") {
			return nil, fmt.Errorf("chaos: -policy %q: want kind=uncertain or kind=retry", part)
		}
		out[kind] = pol
	}
	return out, nil
}

// run executes the command and returns the exit code: 0 when every
// invariant holds, 1 when one is violated, 2 when the run could not be made.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseOptions(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	began := time.Now()
	logf := func(format string, args ...any) {
		if !o.quiet {
			fmt.Fprintf(stderr, "chaos: %5.1fs "+format+"\n", append([]any{time.Since(began).Seconds()}, args...)...)
		}
	}
	if o.check != "" {
		f, err := os.Open(o.check)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
		h, err := ReadHistory(f)
		f.Close()
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
		return report(stdout, h, o.asJSON)
	}
	if o.root == "" {
		if o.root, err = moduleRoot(); err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
	}
	if o.plant == "list" {
		listPlants(stdout, o.root)
		return 0
	}
	if o.plant != "" {
		p, ok := findPlant(o.plant)
		if !ok {
			fmt.Fprintf(stderr, "chaos: unknown plant %q; -plant list names them\n", o.plant)
			return 2
		}
		if !p.hooked(o.root) {
			fmt.Fprintf(stderr, "chaos: plant %q has no hook in %s (any of %s; see the chaos README)\n", o.plant, o.root, strings.Join(p.Pkgs, ", "))
			return 2
		}
	}
	h, dir, err := soak(ctx, o, logf)
	if err != nil {
		fmt.Fprintln(stderr, err)
		if dir != "" {
			fmt.Fprintf(stderr, "chaos: logs kept in %s\n", dir)
		}
		return 2
	}
	code := report(stdout, h, o.asJSON)
	if code != 0 || o.keep {
		fmt.Fprintf(stderr, "chaos: history and logs kept in %s\n", dir)
	} else {
		os.RemoveAll(dir)
	}
	return code
}

// moduleRoot is the repository root: the directory of the go.work that
// joins the library, the example and the tools, where "go build ./example"
// builds the example against the library in the same checkout.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOWORK").Output()
	if err != nil {
		return "", fmt.Errorf("chaos: go env GOWORK: %w", err)
	}
	work := strings.TrimSpace(string(out))
	if work == "" || work == "off" {
		return "", errors.New("chaos: not inside the idemgate workspace (go.work); run from the checkout or pass -root")
	}
	return filepath.Dir(work), nil
}

// soak makes one run and returns its history and run directory.
func soak(ctx context.Context, o options, logf func(string, ...any)) (History, string, error) {
	kinds, err := parseKinds(o.faults, o.store)
	if err != nil {
		return History{}, "", err
	}
	policy, err := parsePolicy(o.policy)
	if err != nil {
		return History{}, "", err
	}
	// Nothing outlives the run: the context bounds every wait.
	ctx, cancel := context.WithTimeout(ctx, o.duration+o.bound+5*time.Minute)
	defer cancel()

	sys, err := startSystem(ctx, systemConfig{root: o.root, plant: o.plant, store: o.store, policy: o.policy,
		genTime: o.genTime, workers: 4, log: logf})
	if sys != nil {
		defer sys.stop()
	}
	if err != nil {
		dir := ""
		if sys != nil {
			dir = sys.dir
		}
		return History{}, dir, err
	}
	histPath := o.history
	if histPath == "" {
		histPath = filepath.Join(sys.dir, "history.jsonl")
	}
	hf, err := os.Create(histPath)
	if err != nil {
		return History{}, sys.dir, fmt.Errorf("chaos: history: %w", err)
	}
	defer hf.Close()
	rec := newRecorder(hf)

	// The policy the workers run, as they say it: the checker judges
	// generator calls by what the system did, not by what was asked.
	if policy, err = sys.workerPolicy(policy); err != nil {
		return History{}, sys.dir, err
	}
	meta := Meta{Seed: o.seed, Duration: o.duration, Plant: o.plant, Bound: o.bound, Policy: policy, Store: o.store, Start: time.Now()}
	heal := meta.Start.Add(o.duration)
	var nodes []string
	for _, p := range sys.api() {
		nodes = append(nodes, p.url())
	}
	w := &workload{rec: rec, nodes: nodes, secret: []byte(sys.secret), clients: o.clients, seed: o.seed,
		stopNew: heal, deadline: heal.Add(o.bound), patience: 2 * time.Second}
	nem := &nemesis{sys: sys, rec: rec, rng: rand.New(rand.NewPCG(uint64(o.seed), 0x6e656d)), kinds: kinds, log: logf}
	if sys.redis != nil {
		nem.flush = redis.NewClient(&redis.Options{Addr: sys.redis.Addr, MaxRetries: -1, DialTimeout: time.Second})
		defer nem.flush.Close()
	}
	defer nem.close()

	logf("seed %d: %d clients, records in %s, faults for %v (%s), then %v to finish", o.seed, o.clients, o.store, o.duration, strings.Join(kinds, ","), o.bound)
	clientsDone := make(chan error, 1)
	go func() { clientsDone <- w.run(ctx) }()
	nem.run(ctx, heal)
	meta.Heal = time.Now()
	logf("healed; waiting for the clients")
	select {
	case err := <-clientsDone:
		if err != nil {
			return History{}, sys.dir, err
		}
	case <-ctx.Done():
		return History{}, sys.dir, ctx.Err()
	}
	logf("clients done; waiting for tasks to end")
	if err := waitTasksEnd(ctx, sys, meta.Heal.Add(o.bound)); err != nil {
		return History{}, sys.dir, err
	}
	logf("tasks ended; reading the table and the logs")
	if err := dumpTable(ctx, sys, rec); err != nil {
		return History{}, sys.dir, err
	}
	if err := dumpExports(ctx, sys, rec); err != nil {
		return History{}, sys.dir, err
	}
	for _, p := range sys.procs {
		if p.kind != workerProc {
			continue // API nodes run no workers (-workers 0)
		}
		calls, err := genCalls(p.name, p.logf)
		if err != nil {
			return History{}, sys.dir, fmt.Errorf("chaos: read the log of %s: %w", p.name, err)
		}
		for _, g := range calls {
			rec.gen(g)
		}
	}
	starts, found, err := upstreamCalls(ctx, sys)
	if err != nil {
		return History{}, sys.dir, err
	}
	for _, g := range starts {
		rec.gen(g)
	}
	meta.Starts = found
	meta.End = time.Now()
	rec.meta(meta)
	if err := rec.flush(); err != nil {
		return History{}, sys.dir, fmt.Errorf("chaos: write history: %w", err)
	}
	return rec.history(), sys.dir, nil
}

// waitTasksEnd waits until no task is pending, running or retrying, or
// until deadline (then invariant 4 reports the stragglers).
func waitTasksEnd(ctx context.Context, sys *system, deadline time.Time) error {
	conn, err := pgx.Connect(ctx, sys.pg.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("chaos: connect to postgres: %w", err)
	}
	defer conn.Close(context.Background())
	for {
		var open int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM idemgate_tasks WHERE state IN ('pending', 'running', 'retrying')`).Scan(&open)
		if err != nil {
			return fmt.Errorf("chaos: count open tasks: %w", err)
		}
		if open == 0 || time.Now().After(deadline) {
			return nil
		}
		sleep(ctx, 250*time.Millisecond)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// upstreamCalls reads the stand-in upstream's call log, when the example
// keeps one (idemgate_example_upstream_calls: a row per request received,
// written before the generator runs): every generator call at its start,
// durable across kills. When the log has a caller column (the worker's
// name, WORKER_NAME, which the tool sets to the process's name), each call
// names its process; otherwise Proc is "" (any worker). found is false
// when there is no such table.
func upstreamCalls(ctx context.Context, sys *system) (calls []GenCall, found bool, err error) {
	conn, err := pgx.Connect(ctx, sys.pg.DSN("postgres"))
	if err != nil {
		return nil, false, fmt.Errorf("chaos: connect to postgres: %w", err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(ctx, `SELECT to_regclass('idemgate_example_upstream_calls') IS NOT NULL`).Scan(&found); err != nil || !found {
		return nil, false, err
	}
	var hasCaller bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM information_schema.columns
	WHERE table_name = 'idemgate_example_upstream_calls' AND column_name = 'caller' AND table_schema = current_schema())`).Scan(&hasCaller); err != nil {
		return nil, false, fmt.Errorf("chaos: read the upstream's columns: %w", err)
	}
	caller := `''`
	if hasCaller {
		caller = `COALESCE(caller, '')`
	}
	rows, err := conn.Query(ctx, `SELECT ref, outcome, sent_at, `+caller+` FROM idemgate_example_upstream_calls ORDER BY id`)
	if err != nil {
		return nil, false, fmt.Errorf("chaos: read the upstream's calls: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		g := GenCall{Phase: "start"}
		var name string
		if err := rows.Scan(&g.Task, &g.Result, &g.At, &name); err != nil {
			return nil, false, fmt.Errorf("chaos: read an upstream call: %w", err)
		}
		// Only a name the tool gave counts: any other could match no
		// fault and condemn a call that a fault did cut off.
		if p := sys.byName(name); p != nil && p.kind == workerProc {
			g.Proc = name
		}
		calls = append(calls, g)
	}
	return calls, true, rows.Err()
}

// dumpTable records every task row, with its results checked for PNGs.
func dumpTable(ctx context.Context, sys *system, rec *recorder) error {
	conn, err := pgx.Connect(ctx, sys.pg.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("chaos: connect to postgres: %w", err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT id::text, tenant, owner, kind, idempotency_key, COALESCE(params, 'null'::jsonb),
	state, attempt, results, error, created_at, recoveries FROM idemgate_tasks ORDER BY created_at`)
	if err != nil {
		return fmt.Errorf("chaos: read tasks: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var w Row
		var params, results []byte
		if err := rows.Scan(&w.ID, &w.Tenant, &w.Owner, &w.Kind, &w.IdemKey, &params, &w.State, &w.Attempt,
			&results, &w.Error, &w.CreatedAt, &w.Recoveries); err != nil {
			return fmt.Errorf("chaos: read task: %w", err)
		}
		var p Params
		_ = json.Unmarshal(params, &p)
		w.ParamsFP = p.FP()
		var items []json.RawMessage
		_ = json.Unmarshal(results, &items)
		w.Results = len(items)
		for _, it := range items {
			var u string
			if json.Unmarshal(it, &u) == nil && isPNGDataURL(u) {
				w.PNGs++
			}
		}
		rec.row(w)
	}
	return rows.Err()
}

// dumpExports records every row of the export route's ledger, each run
// named by the API node that served it. The route creates the ledger on
// its first export: no table, no runs.
func dumpExports(ctx context.Context, sys *system, rec *recorder) error {
	conn, err := pgx.Connect(ctx, sys.pg.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("chaos: connect to postgres: %w", err)
	}
	defer conn.Close(context.Background())
	var found bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('idemgate_example_exports') IS NOT NULL`).Scan(&found); err != nil || !found {
		return err
	}
	procs := map[string]string{}
	for _, p := range sys.api() {
		procs[p.addr] = p.name
	}
	rows, err := conn.Query(ctx, `SELECT id, tenant, owner, idempotency_key, task_id::text, node, started_at, created_at
	FROM idemgate_example_exports ORDER BY id`)
	if err != nil {
		return fmt.Errorf("chaos: read the export ledger: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var e Export
		var node string
		if err := rows.Scan(&e.ID, &e.Tenant, &e.Owner, &e.IdemKey, &e.TaskID, &node, &e.Started, &e.Created); err != nil {
			return fmt.Errorf("chaos: read an export: %w", err)
		}
		e.Proc = procs[node]
		if e.Proc == "" {
			e.Proc = node
		}
		rec.export(e)
	}
	return rows.Err()
}

// ---- report ----

// Summary is the report of a run.
type Summary struct {
	Seed     int64          `json:"seed"`
	Duration string         `json:"duration"`
	Store    string         `json:"store"`
	Plant    string         `json:"plant,omitempty"`
	Faults   map[string]int `json:"faults"`
	Requests map[string]int `json:"requests"`
	Actions  map[string]int `json:"actions"`
	Tasks    map[string]int `json:"tasks"`
	GenCalls int            `json:"generator_calls"`
	// Exports counts the runs of the export handler (its ledger's rows).
	Exports int `json:"exports"`
	// CallsFrom says where the calls were counted: the upstream's call log
	// (at their start) or the workers' logs (at their end).
	CallsFrom string `json:"calls_from"`
	// Notes are oddities that break no invariant but deserve a look, e.g.
	// a byte-identical retry refused with key_reused (a false conflict is
	// safe, but it should not happen).
	Notes      map[string]int `json:"notes,omitempty"`
	Invariants []Result       `json:"invariants"`
	Holds      bool           `json:"holds"`
}

func summarize(h History) Summary {
	s := Summary{Seed: h.Meta.Seed, Duration: h.Meta.Duration.String(), Plant: h.Meta.Plant, Store: h.Meta.Store,
		Faults: map[string]int{}, Requests: map[string]int{}, Actions: map[string]int{}, Tasks: map[string]int{}}
	for _, f := range h.Faults {
		s.Faults[f.Kind]++
	}
	for _, q := range h.Requests {
		s.Requests[outcomeOf(q)]++
	}
	for _, a := range h.Actions {
		s.Actions[a.Scenario+" → "+a.Outcome]++
	}
	for _, w := range h.Rows {
		s.Tasks[w.State]++
	}
	counted := "end"
	s.CallsFrom = "worker logs (at their end)"
	if h.Meta.Starts {
		counted, s.CallsFrom = "start", "upstream call log (at their start)"
	}
	for _, g := range h.Gen {
		if g.Phase == counted {
			s.GenCalls++
		}
	}
	s.Exports = len(h.Exports)
	s.Notes = notes(h)
	s.Invariants = Check(h)
	s.Holds = Holds(s.Invariants)
	return s
}

// notes counts oddities that break no invariant.
func notes(h History) map[string]int {
	type clientKey struct{ tenant, user, key string }
	accepted := map[clientKey]string{} // fingerprint of the first 2xx
	for _, q := range h.Requests {
		k := clientKey{q.Tenant, q.User, q.Key}
		if _, seen := accepted[k]; !seen && q.Route == routeSubmit && ok2xx(q) {
			accepted[k] = q.FP
		}
	}
	out := map[string]int{}
	for _, q := range h.Requests {
		fp, seen := accepted[clientKey{q.Tenant, q.User, q.Key}]
		if q.Route == routeSubmit && q.Code == string(middleware.CodeKeyReused) && seen && fp == q.FP {
			out["identical retry refused with key_reused"]++
		}
	}
	for _, a := range h.Actions {
		if a.Outcome == "rejected" {
			out["action rejected with a 4xx: "+a.Detail]++
		}
	}
	return out
}

// outcomeOf names a request's outcome for the summary.
func outcomeOf(q Request) string {
	route := q.Route
	switch {
	case q.Status == 0:
		return route + " transport error"
	case q.Replayed:
		return fmt.Sprintf("%s %d replayed", route, q.Status)
	case q.Code != "":
		return fmt.Sprintf("%s %d %s", route, q.Status, q.Code)
	}
	return fmt.Sprintf("%s %d", route, q.Status)
}

// report prints the summary and returns the exit code.
func report(w io.Writer, h History, asJSON bool) int {
	s := summarize(h)
	code := 0
	if !s.Holds {
		code = 1
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(s)
		return code
	}
	plant := s.Plant
	if plant == "" {
		plant = "none"
	}
	store := s.Store
	if store == "" {
		store = "redis"
	}
	fmt.Fprintf(w, "chaos: seed %d, %s of faults, plant %s, records in %s, policy %s\n\n", s.Seed, s.Duration, plant, store, formatPolicy(h.Meta.Policy))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	table(tw, "faults injected", s.Faults)
	table(tw, "requests by outcome", s.Requests)
	table(tw, "client actions by outcome", s.Actions)
	table(tw, "tasks by final state", s.Tasks)
	fmt.Fprintf(tw, "generator calls, from the %s\t%d\n", s.CallsFrom, s.GenCalls)
	fmt.Fprintf(tw, "export runs, from the export ledger\t%d\n\n", s.Exports)
	if len(s.Notes) > 0 {
		table(tw, "notes (no invariant broken)", s.Notes)
	}
	fmt.Fprintf(tw, "invariant\tverdict\n")
	for _, r := range s.Invariants {
		verdict := "holds"
		if !r.Holds {
			verdict = fmt.Sprintf("VIOLATED (%d)", r.Violations)
		}
		fmt.Fprintf(tw, "%d. %s\t%s\n", r.N, r.Name, verdict)
	}
	tw.Flush()
	for _, r := range s.Invariants {
		for _, e := range r.Examples {
			fmt.Fprintf(w, "  invariant %d: %s\n", r.N, e)
		}
	}
	if s.Holds {
		fmt.Fprintln(w, "\nevery invariant holds")
	} else {
		fmt.Fprintln(w, "\nINVARIANTS VIOLATED")
	}
	return code
}

func table(w io.Writer, title string, m map[string]int) {
	fmt.Fprintf(w, "%s\tcount\n", title)
	keys := make([]string, 0, len(m))
	total := 0
	for k, n := range m {
		keys = append(keys, k)
		total += n
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  %s\t%d\n", k, m[k])
	}
	fmt.Fprintf(w, "  (total)\t%d\n\n", total)
}
