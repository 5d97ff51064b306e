// Command example is a runnable image-task service protected by idemgate:
// an echo API that accepts generation jobs under an Idempotency-Key, a
// Postgres task store with workers, and a stand-in generator that makes
// real PNG images.
//
// With nothing configured it runs on embedded defaults: an in-process
// miniredis and a throwaway PostgreSQL cluster that is removed on exit.
//
//	go run ./example            # serve on localhost:8080 with 2 in-process workers
//	go run ./example demo       # the narrated retry story, on an embedded server
//	go run ./example -h         # commands, flags and environment
//
// Several serve and worker processes may share one Redis and one Postgres
// (REDIS_URL, DATABASE_URL): that is how the service scales out.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

const usage = `idemgate example: an image-task service whose retries are safe.

Usage:
  go run ./example [command] [flags]

Commands:
  serve     API and in-process workers (the default)
  worker    workers only; needs DATABASE_URL
  migrate   create or upgrade the schema; needs DATABASE_URL
  token     print a dev JWT:  token -tenant acme -user alice
  demo      the narrated retry story, against -url or an embedded server
  tasks     operator tools; needs DATABASE_URL: list, show, retry, cancel,
            limits, pause, resume (run "tasks -h")

Environment (a flag, when given, wins):
  ADDR          listen address (-addr); default localhost:8080 (loopback only;
                :8080 listens on every interface)
  DATABASE_URL  PostgreSQL URL (-database-url); unset: a throwaway local
                cluster (initdb + postgres), removed on exit
  REDIS_URL     Redis URL (-redis-url); unset: an in-process miniredis.
                One node: redis://host:6379/0. A cluster: several seeds,
                redis://h1:7000,h2:7001,h3:7002. Sentinel:
                redis://s1:26379,s2:26379?master_name=mymaster
  STORE         where idempotency records live (-store): redis (the default)
                or postgres (the tasks' database; no Redis at all)
  JWT_SECRET    HS256 secret for bearer tokens. Unset (or set to the public dev
                secret): the dev secret (anyone can mint tokens), only on
                throwaway backends (no DATABASE_URL, no REDIS_URL) and a
                loopback ADDR; otherwise serve refuses to start unless
                DEV_MODE=1
  DEV_MODE      1: use the public dev secret anyway (-dev); never in production
  WORKERS       in-process workers (-workers); default 2
  GEN_TIME      stand-in generation time per task (-gen-time); default 1.5s
  TASK_POLICY   what a lost attempt becomes (-policy), e.g. images=uncertain,music=retry
  WORKER_NAME   the worker's name (-name); default host:pid
  EXPORTS_PER_MINUTE, SUBMITS_PER_MINUTE
                new exports / image and music tasks one tenant may start per
                minute on one node (-exports-per-minute 6, -submits-per-minute
                120; a minute's worth at once; 0: no limit); more is 429
  READ_HEADER_TIMEOUT, READ_TIMEOUT, WRITE_TIMEOUT, IDLE_TIMEOUT
                HTTP server limits (-read-header-timeout 5s, -read-timeout 10s,
                -write-timeout 30s, -idle-timeout 60s)
  DEMO_URL      server the demo talks to (-url); unset: an embedded one
  ADMIN_ADDR    admin listener with /metrics (-admin-addr); default
                localhost:9464; "off" disables it
  OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, ...
                traces: "console" (stdout) or "otlp" (OTLP/HTTP); off by default
  OTEL_METRICS_TENANT=true  the tenant as a metric attribute (opt in)

API (bearer token with claims tenant, sub, exp):
  GET  /                   the page: sign in (dev secret only), generate, retry, reword
  GET  /healthz
  POST /v1/images          {prompt, aspect_ratio, n, reference_image, client_note}
                           Idempotency-Key required  → 202 {task_id, status, poll_after_ms}
  POST /v1/music           {prompt, seconds}; Idempotency-Key required
  GET  /v1/tasks/{id}      {task_id, status, poll_after_ms?, images?, error?}
  POST /v1/tasks/{id}/recover
  POST /v1/tasks/{id}/cancel   stops the task (owner only, idempotent)  → 200 {task_id, status}

Prompt markers for the stand-in generator (put them anywhere in the prompt):
  #fail      the upstream refuses             → failed
  #timeout   the upstream answers too late    → uncertain, then reconciled → succeeded
  #empty     the upstream returns no images   → failed ("no result items")
  #partial   the upstream fails after 1 image → failed, recoverable via /recover

Run "go run ./example <command> -h" for a command's flags.
`

// run executes one command line and returns the exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		cmd = "help"
	} else if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "serve":
		err = cmdServe(ctx, args, getenv, stdout, stderr)
	case "worker":
		err = cmdWorker(ctx, args, getenv, stdout, stderr)
	case "migrate":
		err = cmdMigrate(ctx, args, getenv, stdout, stderr)
	case "token":
		err = cmdToken(args, getenv, stdout, stderr)
	case "demo":
		err = cmdDemo(ctx, args, getenv, stdout, stderr)
	case "tasks":
		err = cmdTasks(ctx, args, getenv, stdout, stderr)
	case "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "example: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	default:
		fmt.Fprintf(stderr, "example %s: %v\n", cmd, err)
		return 1
	}
}

// errUsage reports a bad command line; the flag package already said why.
var errUsage = errors.New("usage")

// settings are the flags shared by the commands, with their env fallbacks.
type settings struct {
	addr        string
	databaseURL string
	redisURL    string
	store       string // records store: "redis" (or "") or "postgres"
	jwtSecret   string
	dev         bool // DEV_MODE: the public dev secret, whatever the backends
	workers     int
	genTime     time.Duration
	policy      string        // TASK_POLICY
	workerName  string        // WORKER_NAME
	taskLease   time.Duration // TASK_LEASE: the workers' lease; 0 is pgstore's default
	idemLease   time.Duration // IDEM_LEASE: the middleware's claim lease; 0 is its default
	exportTime  time.Duration // EXPORT_TIME: the stand-in renderer's time; 0 is exportRenderTime
	obs         obsSettings
	limits      serverLimits // HTTP server timeouts (serve.go)
	// exportLimit and submitLimit bound the new actions one tenant starts
	// (EXPORTS_PER_MINUTE, SUBMITS_PER_MINUTE); zero: no limit.
	exportLimit, submitLimit tenantLimit
}

// newFlagSet returns a flag set for cmd whose -h prints summary, the flags
// and the top-level usage pointer.
func newFlagSet(cmd, summary string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: go run ./example %s [flags]\n\n%s\n\nFlags:\n", cmd, summary)
		fs.PrintDefaults()
		fmt.Fprintf(stderr, "\nRun \"go run ./example -h\" for the commands, environment, API and prompt markers.\n")
	}
	return fs
}

// addStoreFlags registers -database-url and -redis-url (as needed) and the
// JWT secret on s, with env fallbacks.
func (s *settings) addStoreFlags(fs *flag.FlagSet, getenv func(string) string, redis bool) {
	fs.StringVar(&s.databaseURL, "database-url", getenv("DATABASE_URL"),
		"PostgreSQL URL (env DATABASE_URL); empty: a throwaway local cluster, removed on exit")
	if redis {
		fs.StringVar(&s.redisURL, "redis-url", getenv("REDIS_URL"),
			"Redis URL (env REDIS_URL); empty: an in-process miniredis")
		fs.StringVar(&s.store, "store", getenv("STORE"),
			"where idempotency records live (env STORE): redis or postgres (no Redis at all); empty: redis")
	}
	// The secret comes from the environment only: a flag would show in ps.
	s.jwtSecret = getenv("JWT_SECRET")
	if redis { // the commands that serve the API
		dev, _ := strconv.ParseBool(getenv("DEV_MODE"))
		fs.BoolVar(&s.dev, "dev", dev, "use the public dev secret even with DATABASE_URL/REDIS_URL set or a non-loopback -addr (env DEV_MODE=1); "+
			"without JWT_SECRET it is used only on throwaway backends and loopback")
	}
}

func (s *settings) addWorkerFlags(fs *flag.FlagSet, getenv func(string) string, workers int) {
	fs.IntVar(&s.workers, "workers", envInt(getenv, "WORKERS", workers),
		"number of in-process workers (env WORKERS)")
	fs.DurationVar(&s.genTime, "gen-time", envDuration(getenv, "GEN_TIME", 1500*time.Millisecond),
		"how long the stand-in generator takes per task (env GEN_TIME)")
	fs.StringVar(&s.policy, "policy", getenv("TASK_POLICY"),
		"what a lost attempt becomes, per kind (env TASK_POLICY): kind=uncertain|retry,...; empty: "+formatPolicy(defaultPolicy))
	fs.StringVar(&s.workerName, "name", getenv("WORKER_NAME"),
		"this process's worker name, in logs and the stand-in upstream's call log (env WORKER_NAME); empty: host:pid")
	fs.DurationVar(&s.taskLease, "task-lease", envDuration(getenv, "TASK_LEASE", 0),
		"how long a worker's attempt owns its task without a heartbeat (env TASK_LEASE); 0: pgstore's default (the chaos soak's short-lease mode sets 1-2s)")
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return errUsage
	}
	return nil
}

func envInt(getenv func(string) string, name string, def int) int {
	if n, err := strconv.Atoi(getenv(name)); err == nil {
		return n
	}
	return def
}

func envDuration(getenv func(string) string, name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(getenv(name)); err == nil {
		return d
	}
	return def
}
