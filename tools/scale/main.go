// Command scale measures how the cost of idemgate's stores grows with
// their work (issue #30): pgstore's claim and Submit as the queue's
// backlog, its tenants, its capped tenants and its scheduled tasks grow;
// pgrecords' claim of a new key, replay and sweep as its table grows; the
// Redis store's memory per record and replay as its keyspace grows. Each
// figure is printed beside its ratio to a small queue or table measured
// in the same run, with the machine's load, so that runs on a shared
// machine can still be compared.
//
//	go run ./tools/scale -quick    # no 1M backlog; 1M records instead of 10M: about 10 minutes
//	go run ./tools/scale           # the full sizes: most of an hour, ~8 GB of disk and RAM
//	go run ./tools/scale -parts records,redis
//
// Everything goes through the stores' public API, so the command measures
// the statements the stores send: a claim is timed by a real pgstore.Worker
// (WorkerClaimed's Latency, the claim's round trip as the worker sends
// it, its kind locks included), whose no-op handler submits a
// replacement for each task it runs, so the queue keeps its size while it
// is measured. Queues are filled with SubmitMany, so every row is stored
// as Submit stores it; only the records are copied in bulk, from one
// record each store wrote.
//
// It starts a throwaway PostgreSQL cluster and redis-server (package
// devserver) and removes them at exit; with DATABASE_URL (a superuser's,
// databases are created and dropped) or REDIS_URL it uses those instead.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
)

// parts are what the command can measure, in the order it runs them.
var parts = []string{"queue", "records", "redis"}

func main() {
	quick := flag.Bool("quick", false, "smaller top sizes: no 1M backlog, 1M records instead of 10M")
	only := flag.String("parts", strings.Join(parts, ","), "parts to run, comma-separated")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "scale: unexpected arguments:", flag.Args())
		os.Exit(2)
	}
	sz := fullSizes()
	if *quick {
		sz = quickSizes()
	}
	chosen := strings.Split(*only, ",")
	for _, p := range chosen {
		if !slices.Contains(parts, p) {
			fmt.Fprintf(os.Stderr, "scale: unknown part %q (parts: %s)\n", p, strings.Join(parts, ","))
			os.Exit(2)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	env := environment{databaseURL: os.Getenv("DATABASE_URL"), redisURL: os.Getenv("REDIS_URL"), log: os.Stderr}
	if err := run(ctx, os.Stdout, env, sz, chosen); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

// environment is where a run finds its servers and says its progress.
type environment struct {
	databaseURL string // a superuser's URL, or "" for a throwaway server
	redisURL    string // or "" for a throwaway server
	log         io.Writer
}

// run measures the chosen parts at sizes sz and writes their tables to out.
func run(ctx context.Context, out io.Writer, env environment, sz sizes, chosen []string) error {
	fmt.Fprintf(out, "scale: %s\n\n", describeMachine())
	if slices.Contains(chosen, "queue") || slices.Contains(chosen, "records") {
		pg, err := startPostgres(ctx, env.databaseURL)
		if err != nil {
			return err
		}
		defer pg.close()
		if slices.Contains(chosen, "queue") {
			if err := measureQueue(ctx, out, env.log, pg, sz); err != nil {
				return fmt.Errorf("queue: %w", err)
			}
		}
		if slices.Contains(chosen, "records") {
			if err := measureRecords(ctx, out, env.log, pg, sz); err != nil {
				return fmt.Errorf("records: %w", err)
			}
		}
	}
	if slices.Contains(chosen, "redis") {
		if err := measureRedis(ctx, out, env.log, env.redisURL, sz); err != nil {
			return fmt.Errorf("redis: %w", err)
		}
	}
	return nil
}
