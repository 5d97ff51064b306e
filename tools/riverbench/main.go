// Command riverbench measures pgstore against River (riverqueue/river with
// riverpgxv5) side by side on one PostgreSQL server: the same work, in
// alternating rounds, with River both at its defaults and tuned for short
// jobs (FetchCooldown at its minimum, a 50 ms FetchPollInterval). It prints
// a table of rates and latencies, pgstore's ratio to each River variant,
// and the machine it ran on.
//
//	cd riverbench && go run . -quick    # about 3 minutes
//	cd riverbench && go run .           # about 4–5 minutes
//
// It starts a throwaway PostgreSQL cluster (initdb and postgres from PATH or
// /usr/lib/postgresql, run as the postgres user when root) and removes it at
// exit; with DATABASE_URL it uses that server instead. Each system gets a
// database of its own, created for the run and dropped after it. Worker
// processes are this binary run with the worker subcommand.
//
// It lives in a module of its own so that the library's go.mod does not
// carry River.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		if err := workerMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "riverbench worker:", err)
			os.Exit(1)
		}
		return
	}
	quick := flag.Bool("quick", false, "a short run (about 3 minutes: 5 rounds, 4 of work) instead of the full one")
	rows := flag.String("rows", allRowNames, "rows to run, comma-separated")
	stmts := flag.Bool("statements", false, "load pg_stat_statements and print each row's top statements per system (for profiling)")
	profileDir := flag.String("profile", "", "write a CPU profile of every worker process to this directory (SYSTEM-N.pprof)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *quick, *stmts, *profileDir, strings.Split(*rows, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "riverbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, quick, stmts bool, profileDir string, rows []string) error {
	for _, row := range rows {
		if !slices.Contains(strings.Split(allRowNames, ","), row) {
			return fmt.Errorf("unknown row %q (rows: %s)", row, allRowNames)
		}
	}
	size := fullSizes()
	if quick {
		size = quickSizes()
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	before := loadAverage()
	dbs, err := startDatabases(ctx, os.Getenv("DATABASE_URL"), stmts, connsNeeded(size))
	if err != nil {
		return err
	}
	defer dbs.close()
	b, err := newBench(ctx, exe, dbs.dsns, size)
	if err != nil {
		return err
	}
	defer b.close()
	b.serverCPU = dbs.cpu
	b.profileDir = profileDir
	if stmts {
		if b.stmts, err = openStatements(ctx, dbs.admin); err != nil {
			return err
		}
		defer b.stmts.close()
	}
	began := time.Now()
	if err := b.run(ctx, rows); err != nil {
		return err
	}
	m := machine{loadBefore: before, loadAfter: loadAverage(), took: time.Since(began), server: dbs.version,
		quick: quick}
	report(os.Stdout, b.res, size, m)
	return nil
}

// newBench opens every system's inserting side on its database.
func newBench(ctx context.Context, exe string, dsns map[string]string, size sizes) (*bench, error) {
	b := &bench{exe: exe, dsns: dsns, queues: map[string]queue{}, size: size, log: os.Stderr, res: newResults()}
	for _, sys := range systems() {
		q, err := openQueue(ctx, sys, dsns[sys], submitConns(size))
		if err != nil {
			b.close()
			return nil, fmt.Errorf("%s: %w", sys, err)
		}
		b.queues[sys] = q
	}
	return b, nil
}

// submitConns is the pool size of each system's inserting side.
func submitConns(size sizes) int { return max(size.Clients, size.BatchClients) + 2 }

// connsNeeded is how many connections a run holds at most: every
// inserting side, plus a worker process per system in the latency row.
func connsNeeded(size sizes) int {
	n := len(systems()) * (submitConns(size) + workerConns(size.Slots))
	return n + 5 // the admin and statements connections, with room
}

func (b *bench) close() {
	for _, q := range b.queues {
		q.close()
	}
}
