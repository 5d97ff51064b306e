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
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
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
	modes    string
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
	fs.StringVar(&o.modes, "modes", "random", "modes besides the faults: random (dealt by the seed), all, none, or a comma list of "+strings.Join(modeNames, ","))
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
