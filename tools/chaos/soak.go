package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// soak makes one run and returns its history and run directory.
func soak(ctx context.Context, o options, logf func(string, ...any)) (History, string, error) {
	kinds, err := parseKinds(o.faults, o.store)
	if err != nil {
		return History{}, "", err
	}
	pl, err := makePlan(o.modes, o.seed, o.genTime)
	if err != nil {
		return History{}, "", err
	}
	policy, err := parsePolicy(o.policy)
	if err != nil {
		return History{}, "", err
	}
	// Building and starting are bounded on their own (startSystem): on a
	// loaded machine a build from a cold directory takes minutes, which
	// must not eat the run's time.
	sys, err := startSystem(ctx, systemConfig{root: o.root, plant: o.plant, store: o.store, policy: o.policy,
		genTime: pl.genTime, lease: pl.lease, exportTime: pl.exportTime, workers: 4, log: logf})
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
	// Nothing outlives the run: the context bounds every wait.
	ctx, cancel := context.WithTimeout(ctx, o.duration+o.bound+5*time.Minute)
	defer cancel()
	// Every process runs to the end of the run: one that exits on its own
	// is started again. It stops before sys.stop kills them all.
	supCtx, stopSupervising := context.WithCancel(ctx)
	supDone := make(chan struct{})
	go func() { defer close(supDone); sys.supervise(supCtx, superviseEvery, logf) }()
	defer func() { stopSupervising(); <-supDone }()
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
	meta := Meta{Seed: o.seed, Duration: o.duration, Plant: o.plant, Bound: o.bound, Policy: policy, Store: o.store, Start: time.Now(),
		Modes: pl.modes, Lease: pl.lease, GenTime: pl.genTime, ExportTime: pl.exportTime}
	if pl.has("flood") {
		meta.Flood = floodTenant
	}
	heal := meta.Start.Add(o.duration)
	var nodes []string
	for _, p := range sys.api() {
		nodes = append(nodes, p.url())
	}
	ack, aim := &acks{}, &aims{}
	w := &workload{rec: rec, nodes: nodes, secret: []byte(sys.secret), clients: o.clients, seed: o.seed,
		stopNew: heal, deadline: heal.Add(o.bound), patience: 2*time.Second + pl.exportTime, plan: pl, acks: ack, aims: aim}
	nem := &nemesis{sys: sys, rec: rec, rng: rand.New(rand.NewPCG(uint64(o.seed), 0x6e656d)), kinds: kinds, log: logf,
		plan: pl, acks: ack, aims: aim}
	if sys.redis != nil {
		nem.flush = redis.NewClient(&redis.Options{Addr: sys.redis.Addr, MaxRetries: -1, DialTimeout: time.Second})
		defer nem.flush.Close()
	}
	defer nem.close()

	logf("seed %d: %d clients, records in %s, %s, faults for %v (%s), then %v to finish", o.seed, o.clients, o.store, pl, o.duration, strings.Join(kinds, ","), o.bound)
	clientsDone := make(chan error, 1)
	go func() { clientsDone <- w.run(ctx) }()
	limitsDone := make(chan struct{})
	if pl.has("limits") {
		lim := &limiter{sys: sys, rec: rec, rng: rand.New(rand.NewPCG(uint64(o.seed), 0x6c696d)), log: logf}
		go func() { defer close(limitsDone); lim.run(ctx, heal) }()
	} else {
		close(limitsDone)
	}
	nem.run(ctx, heal)
	<-limitsDone
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
