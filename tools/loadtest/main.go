// Command loadtest measures idemgate against its floor.
//
// In one run it starts a throwaway redis-server and PostgreSQL (or uses
// -redis-url / -database-url), serves seven stacks on loopback (or those
// that -stacks names) and drives each with concurrent keep-alive HTTP
// clients for a fixed duration per scenario:
//
//   - floor: a bare echo handler doing by hand the fewest plain Redis
//     commands an idempotency layer needs (the physical limit: SET NX PX
//     GET to claim, SET to store the response, for a miss; that one
//     SET NX PX GET finding the record, the cost of a GET, for a replay or
//     a conflict), with a naive SHA-256 of the body as its fingerprint and
//     no key derivation;
//   - floor-script: the same, with the claim done by a claim-or-read Lua
//     script (as idemgate did before records v2);
//   - idemgate: echo + middleware (RedisStore) in this process;
//   - idemgate-http: net/http's ServeMux + idemhttp (RedisStore), the
//     same handler work on net/http;
//   - pg-floor: a bare echo handler doing by hand the fewest Postgres
//     statements for records, on a table of pgrecords' shape: INSERT … ON
//     CONFLICT DO NOTHING, then UPDATE by primary key, for a miss; one
//     SELECT by primary key for a replay or a conflict (the load tool tells
//     it whether a key is new, an oracle no real layer has: that is what
//     makes it a floor);
//   - idemgate-pg: echo + middleware on pgrecords.
//   - idemgate-pg-atomic: idemgate-pg on an Atomic route, the task's
//     INSERT in the transaction that stores the answer.
//
// -pg-write ledger compares idemgate-pg-atomic with idemgate-pg alone (it
// refuses the other stacks): their handler then writes one ledger row
// (one INSERT into loadtest_ledger, a table the tool creates and drops)
// instead of the task, on the Atomic route in its transaction, on the
// plain route in autocommit on the same records pool, so that the round
// trips compare.
//
// floor-script, idemgate and idemgate-http are compared to floor, idemgate-pg to
// pg-floor, idemgate-pg-atomic to idemgate-pg. The Postgres stacks keep records on a pool of their own, apart
// from the task work's, so that its round trips are theirs alone; Postgres
// CPU is the whole server's (internal/pgcpu), task work included: the
// same for every stack, since they do the same task work.
//
// Every stack runs the same task work behind its idempotency layer, like
// the example's POST /v1/images: decode and validate the JSON body, then
// pgstore.Submit of the same NewTask (same columns and sizes), each stack
// on a pgstore.Store and pool of its own, into one table under a tenant of
// its own. So the stacks differ only in the idempotency layer, and the
// ratio to the floor is that layer's cost, not Postgres's.
//
// Scenarios: miss (a new key per request), replay (the same request again),
// conflict (a known key with other parameters) and dup (groups of clients
// sending the same new key at the same instant to a slow handler).
//
// Usage:
//
//	go run ./tools/loadtest [-duration 5s] [-rounds 5] [-concurrency 32] [-slow 50ms] [-stacks …] [-scenarios …] [-cluster 3] [-pg-write task|ledger] [-json] [-html out.html]
//
// Each scenario runs -rounds short rounds per stack, alternating the
// stacks, so that all meet the same background load; the ratio to the
// floor is the figure to compare across machines, not the absolute req/s.
// The report gives it over the whole run and as the median of the rounds'
// ratios (each round against the floor's round next to it).
//
// -cluster 3 runs the Redis stacks on a throwaway Redis Cluster of three
// primaries (internal/devserver, as the tests start one), each stack on a
// go-redis ClusterClient; INFO figures add up over the primaries.
//
// Every stack reads the tenant and user from trusted X-Tenant / X-User headers
// (no JWT anywhere), so the ratio measures idempotency, not auth.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/idemgate/idemgate/tools/internal/measure"
)

// options are the command line flags.
type options struct {
	duration    time.Duration
	concurrency int
	dupGroup    int
	slow        time.Duration
	keys        int
	pgConns     int
	scenarios   []string
	stacks      []string
	redisURL    string
	cluster     int
	databaseURL string
	jsonOut     bool
	htmlOut     string
	cpuprofile  string
	warmup      time.Duration
	rounds      int
	// pgWrite is the handler's write on idemgate-pg and idemgate-pg-atomic:
	// pgWriteTask (pgstore.Submit, SubmitTx on the Atomic route) or
	// pgWriteLedger (one INSERT of a ledger row).
	pgWrite string
}

// The values of -pg-write.
const (
	pgWriteTask   = "task"
	pgWriteLedger = "ledger"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `loadtest measures idemgate against hand-written floors (the fewest plain Redis
commands an idempotency layer needs, and a scripted claim), and idemgate on
Postgres records (pgrecords) against the fewest Postgres statements, in one
run on one Redis and one Postgres. Every stack does the same task work behind
its idempotency layer (decode, validate, pgstore.Submit of the same task), so
the ratio to the floor is the idempotency layer's cost alone.

usage: go run ./loadtest [flags]

`)
		fs.PrintDefaults()
	}
	var scen, stacks string
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "measured time per scenario and stack (split over -rounds)")
	fs.IntVar(&o.rounds, "rounds", 5, "alternate the stacks this many times per scenario, so both meet the same background load")
	fs.IntVar(&o.concurrency, "concurrency", 32, "concurrent keep-alive HTTP clients")
	fs.IntVar(&o.dupGroup, "dup-group", 8, "clients sending the same key at once in the dup scenario")
	fs.DurationVar(&o.slow, "slow", 50*time.Millisecond, "handler latency added in the dup scenario")
	fs.IntVar(&o.keys, "keys", 512, "keys prepared for the replay and conflict scenarios")
	fs.IntVar(&o.pgConns, "pg-conns", 16, "size of each Postgres pool: each stack's task pool and each Postgres stack's records pool")
	fs.StringVar(&scen, "scenarios", "miss,replay,conflict,dup", "comma-separated scenarios to run")
	fs.StringVar(&stacks, "stacks", strings.Join(stackOrder, ","), "comma-separated stacks to run (shown in this order: "+strings.Join(stackOrder, ", ")+")")
	fs.IntVar(&o.cluster, "cluster", 0, "run the Redis stacks on a throwaway Redis Cluster of this many primaries (e.g. 3) instead of one redis-server; INFO figures add up over the primaries")
	fs.StringVar(&o.redisURL, "redis-url", "", "use this Redis (redis://…) instead of a throwaway redis-server; use a dedicated one: INFO commandstats is server-wide")
	fs.StringVar(&o.databaseURL, "database-url", "", "use this Postgres instead of a throwaway cluster; use a dedicated database: tasks are written (and removed at the end) and workers there would run them")
	fs.BoolVar(&o.jsonOut, "json", false, "print the results as JSON instead of a table")
	fs.StringVar(&o.htmlOut, "html", "", "also write a self-contained HTML report with plots to this file")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured warm-up per stack before the scenarios")
	fs.StringVar(&o.pgWrite, "pg-write", pgWriteTask, "the handler's write on "+idemgatePGName+" and "+idemgatePGAtomicName+": "+
		pgWriteTask+" (the task, pgstore.Submit on the task pool; on the Atomic route pgstore.SubmitTx in the transaction, under a savepoint) or "+
		pgWriteLedger+" (one INSERT of a row into "+ledgerTable+", which the tool creates and drops: on the Atomic route in its transaction, "+
		"on the plain route in autocommit on the same records pool, so pg rt/req compare). "+
		pgWriteLedger+" compares those two stacks only: -stacks then defaults to them, and naming another stack is an error")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, s := range strings.Split(scen, ",") {
		s = strings.TrimSpace(s)
		if _, ok := scenarioByName[s]; !ok {
			return o, fmt.Errorf("unknown scenario %q (want miss, replay, conflict, dup)", s)
		}
		o.scenarios = append(o.scenarios, s)
	}
	switch o.pgWrite {
	case pgWriteTask:
	case pgWriteLedger:
		stacksSet := false
		fs.Visit(func(f *flag.Flag) { stacksSet = stacksSet || f.Name == "stacks" })
		if !stacksSet {
			stacks = idemgatePGName + "," + idemgatePGAtomicName
		}
	default:
		return o, fmt.Errorf("unknown -pg-write %q (want %s or %s)", o.pgWrite, pgWriteTask, pgWriteLedger)
	}
	want := map[string]bool{}
	for _, s := range strings.Split(stacks, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(stackOrder, s) {
			return o, fmt.Errorf("unknown stack %q (want %s)", s, strings.Join(stackOrder, ", "))
		}
		if o.pgWrite == pgWriteLedger && s != idemgatePGName && s != idemgatePGAtomicName {
			return o, fmt.Errorf("-pg-write %s compares %s with %s (the same ledger INSERT, in autocommit and on an Atomic route): it does not apply to stack %q",
				pgWriteLedger, idemgatePGAtomicName, idemgatePGName, s)
		}
		want[s] = true
	}
	for _, s := range stackOrder {
		if want[s] {
			o.stacks = append(o.stacks, s)
		}
	}
	switch {
	case o.duration <= 0:
		return o, errors.New("-duration must be positive")
	case o.concurrency < 1:
		return o, errors.New("-concurrency must be at least 1")
	case o.dupGroup < 2 || o.dupGroup > o.concurrency:
		return o, errors.New("-dup-group must be between 2 and -concurrency")
	case o.rounds < 1 || o.duration/time.Duration(o.rounds) < 10*time.Millisecond:
		return o, errors.New("-rounds must be at least 1, with at least 10ms per round")
	case o.keys < 1:
		return o, errors.New("-keys must be at least 1")
	case o.pgConns < 1:
		return o, errors.New("-pg-conns must be at least 1")
	case o.cluster < 0 || o.cluster > 0 && o.cluster < 3:
		return o, errors.New("-cluster must be 0 (one redis-server) or at least 3 primaries")
	case o.cluster > 0 && o.redisURL != "":
		return o, errors.New("-cluster starts its own cluster: it does not take -redis-url")
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	stop, err := measure.StartCPUProfile(o.cpuprofile)
	if err != nil {
		return err
	}
	defer stop()

	env, err := startEnv(ctx, o, stderr)
	if err != nil {
		return err
	}
	defer env.close()

	b := newBench(env, o, stderr)
	if err := b.start(ctx); err != nil {
		return err
	}
	rep := report{
		Machine: machine{
			GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, CPUs: runtime.NumCPU(),
			GOMAXPROCS: runtime.GOMAXPROCS(0), Go: runtime.Version(),
			Redis: env.redisVersion, Postgres: env.pgVersion,
			LoadAvgStart: loadAvg(), PostgresCPU: env.pgServer != nil,
		},
		Duration:    o.duration.String(),
		Rounds:      o.rounds,
		Concurrency: o.concurrency,
		Slow:        o.slow.String(),
		DupGroup:    o.dupGroup,
		PGWrite:     o.pgWrite,
	}
	for _, st := range b.stacks {
		if err := b.warm(ctx, st); err != nil {
			return err
		}
	}
	for _, name := range o.scenarios {
		results, err := b.scenario(ctx, scenarioByName[name])
		if err != nil {
			return err
		}
		setRatios(results)
		rep.Results = append(rep.Results, results...)
	}
	rep.Machine.LoadAvgEnd = loadAvg()
	if o.htmlOut != "" {
		if err := writeHTMLFile(o.htmlOut, rep); err != nil {
			return err
		}
	}
	if o.jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	rep.writeTable(stdout)
	return nil
}

// setRatios sets each result's ratio to its floor's, of one scenario: over
// all its rounds, and the median of each round's ratio to the floor's same
// round (they ran one after the other).
func setRatios(results []*result) {
	byStack := map[string]*result{}
	for _, res := range results {
		byStack[res.Stack] = res
	}
	for _, res := range results {
		floor, ok := byStack[res.Floor]
		if !ok {
			continue
		}
		if floor.ReqPerSec > 0 {
			res.RatioToFloor = res.ReqPerSec / floor.ReqPerSec
		}
		var ratios []float64
		for i, r := range res.Rounds {
			if i < len(floor.Rounds) && floor.Rounds[i].ReqPerSec > 0 {
				ratios = append(ratios, r.ReqPerSec/floor.Rounds[i].ReqPerSec)
			}
		}
		if len(ratios) > 0 {
			slices.Sort(ratios)
			res.RatioMedian = ratios[len(ratios)/2]
			if len(ratios)%2 == 0 {
				res.RatioMedian = (ratios[len(ratios)/2-1] + ratios[len(ratios)/2]) / 2
			}
			res.RatioMin, res.RatioMax = ratios[0], ratios[len(ratios)-1]
		}
	}
}

// loadAvg returns /proc/loadavg's 1-minute figure (empty elsewhere): other
// work on the machine moves absolute figures, ratios much less.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}
