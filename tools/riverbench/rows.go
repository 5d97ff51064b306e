package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgate/idemgate/tools/internal/measure"
)

// The rows of the table.
const (
	rowInsert   = "insert"
	rowDup      = "dup"
	rowBatch    = "batch"
	rowWork     = "work"
	rowDrain    = "drain"
	rowLatency  = "latency"
	allRowNames = "insert,dup,batch,work,drain,latency"
)

// sizes is how much work each row does; see quickSizes and fullSizes.
type sizes struct {
	Rounds         int // rounds of the insert, dup and batch rows
	Inserts        int // tasks per system and round (insert, dup)
	Clients        int // goroutines submitting
	BatchSize      int
	Batches        int // per system and round
	BatchClients   int
	WorkRounds     int
	WorkTasks      int // per system and round
	WorkTasksSlow  int // for River at its defaults, capped at 10 fetches/s
	Slots          int // handler slots per worker process
	LatencyRounds  int
	LatencySamples int           // per system and round
	LatencySlot    time.Duration // between two submits (of different systems)
	Settle         time.Duration // after workers start, before measuring
}

func quickSizes() sizes {
	return sizes{Rounds: 5, Inserts: 1500, Clients: 16, BatchSize: 100, Batches: 15, BatchClients: 4,
		WorkRounds: 4, WorkTasks: 2000, WorkTasksSlow: 400, Slots: 16,
		LatencyRounds: 1, LatencySamples: 100, LatencySlot: 50 * time.Millisecond, Settle: 300 * time.Millisecond}
}

func fullSizes() sizes {
	return sizes{Rounds: 5, Inserts: 4000, Clients: 16, BatchSize: 100, Batches: 40, BatchClients: 4,
		WorkRounds: 3, WorkTasks: 5000, WorkTasksSlow: 1000, Slots: 16,
		LatencyRounds: 2, LatencySamples: 150, LatencySlot: 50 * time.Millisecond, Settle: 300 * time.Millisecond}
}

// rate accumulates tasks over time across rounds.
type rate struct {
	tasks   int
	elapsed time.Duration
}

func (r rate) perSecond() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.tasks) / r.elapsed.Seconds()
}

// results are a run's figures, by row key and system.
type results struct {
	mu      sync.Mutex
	rates   map[string]map[string]rate      // row key → system → total
	latency map[string][]time.Duration      // system → samples
	rounds  map[string]map[string][]float64 // row key → system → per-round rate, for the spread
	trips   map[string]map[string]tripCount // row key → system → round trips
}

// tripCount is the round trips a row made for its tasks.
type tripCount struct {
	submit, worker int64
	tasks          int
	workerCPU      time.Duration // of the worker processes, start to exit
	serverCPU      time.Duration // of the PostgreSQL server, while timed
}

func newResults() *results {
	return &results{rates: map[string]map[string]rate{}, latency: map[string][]time.Duration{},
		rounds: map[string]map[string][]float64{}, trips: map[string]map[string]tripCount{}}
}

// round is what one round of a row measured on one system.
type round struct {
	tasks          int
	elapsed        time.Duration
	submit, worker int64         // round trips of the inserting side and the worker processes
	workerCPU      time.Duration // of the worker processes, start to exit
	serverCPU      time.Duration // of the PostgreSQL server, while timed
}

// add records a round of row on sys.
func (r *results) add(row, sys string, m round) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rates[row] == nil {
		r.rates[row] = map[string]rate{}
		r.rounds[row] = map[string][]float64{}
		r.trips[row] = map[string]tripCount{}
	}
	tr := r.trips[row][sys]
	tr.submit += m.submit
	tr.worker += m.worker
	tr.tasks += m.tasks
	tr.workerCPU += m.workerCPU
	tr.serverCPU += m.serverCPU
	r.trips[row][sys] = tr
	t := r.rates[row][sys]
	t.tasks += m.tasks
	t.elapsed += m.elapsed
	r.rates[row][sys] = t
	r.rounds[row][sys] = append(r.rounds[row][sys], rate{m.tasks, m.elapsed}.perSecond())
}

// bench runs the rows against the systems.
type bench struct {
	exe    string            // this binary, for worker processes
	dsns   map[string]string // system → database
	queues map[string]queue  // system → inserting side
	size   sizes
	log    io.Writer // progress
	res    *results
	stmts  *statements // nil unless profiling
	// profileDir, when set, gets a CPU profile of every worker process.
	profileDir string
	// serverCPU reads the server's CPU time so far; nil when unknown.
	serverCPU func() time.Duration
}

// cpuSince returns a function that reports the server's CPU time since
// cpuSince was called, or 0 when unknown.
func (b *bench) cpuSince() func() time.Duration {
	if b.serverCPU == nil {
		return func() time.Duration { return 0 }
	}
	start := b.serverCPU()
	return func() time.Duration { return b.serverCPU() - start }
}

// rotated is the systems in round r's order: each system goes first in
// turn, so drift during a run does not favour one of them.
func rotated(r int) []string {
	s := systems()
	k := r % len(s)
	return append(s[k:len(s):len(s)], s[:k]...)
}

// parallel runs fn(i) for i in [0, n) on clients goroutines and returns the
// elapsed time, or the first error.
func parallel(ctx context.Context, clients, n int, fn func(ctx context.Context, i int) error) (time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := fn(ctx, i); err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), first
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, format+"\n", args...)
}

// run runs the named rows in order.
func (b *bench) run(ctx context.Context, rows []string) error {
	for _, row := range rows {
		if err := b.runRow(ctx, row); err != nil {
			return err
		}
		if b.stmts != nil {
			if err := b.stmts.print(ctx, b.log, row, b.dsns, 8); err != nil {
				return err
			}
		}
	}
	return nil
}

// runRow runs one row, all its rounds.
func (b *bench) runRow(ctx context.Context, row string) error {
	if b.stmts != nil {
		if err := b.stmts.reset(ctx); err != nil {
			return err
		}
	}
	var err error
	switch row {
	case rowInsert:
		err = b.rounds(ctx, b.size.Rounds, b.insertNew)
	case rowDup:
		err = b.rounds(ctx, b.size.Rounds, b.insertDup)
	case rowBatch:
		err = b.rounds(ctx, b.size.Rounds, b.batch)
	case rowWork, rowDrain:
		for _, procs := range []int{1, 2} {
			if err = b.rounds(ctx, b.size.WorkRounds, func(ctx context.Context, r int, sys string) error {
				return b.work(ctx, r, sys, procs, row == rowDrain)
			}); err != nil {
				break
			}
		}
	case rowLatency:
		for r := range b.size.LatencyRounds {
			if err = b.latency(ctx, r); err != nil {
				break
			}
		}
	default:
		err = fmt.Errorf("unknown row %q (rows: %s)", row, allRowNames)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", row, err)
	}
	return nil
}

// rounds runs fn for every system in rotated order, n times.
func (b *bench) rounds(ctx context.Context, n int, fn func(ctx context.Context, r int, sys string) error) error {
	for r := range n {
		for _, sys := range rotated(r) {
			if err := fn(ctx, r, sys); err != nil {
				return fmt.Errorf("%s round %d: %w", sys, r, err)
			}
		}
	}
	return nil
}

// submitAll submits keys[i] for i in [0, n) with the configured clients and
// checks that each found (dup) or did not find its key, as expected.
func (b *bench) submitAll(ctx context.Context, q queue, keys []string, wantDup bool) (time.Duration, error) {
	return parallel(ctx, b.size.Clients, len(keys), func(ctx context.Context, i int) error {
		dup, err := q.submit(ctx, keys[i])
		if err != nil {
			return err
		}
		if dup != wantDup {
			return fmt.Errorf("key %s: duplicate = %v, want %v", keys[i], dup, wantDup)
		}
		return nil
	})
}

// makeKeys makes n idempotency keys shaped as the middleware's
// (keyspace's Key.Task(): the kind, then the hex SHA-256 of the client's
// key), the ones Submit gets in a service; River's args carry the same.
func makeKeys(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		sum := sha256.Sum256(fmt.Appendf(nil, "%s-%d", prefix, i))
		keys[i] = taskKind + ":" + hex.EncodeToString(sum[:])
	}
	return keys
}

// checkCount checks that the system holds exactly want tasks.
func checkCount(ctx context.Context, q queue, want int) error {
	total, _, _, err := q.finished(ctx)
	if err != nil {
		return err
	}
	if total != want {
		return fmt.Errorf("%d tasks stored, want %d", total, want)
	}
	return nil
}

// insertNew is the "insert, new key" row: every submit creates a task.
func (b *bench) insertNew(ctx context.Context, r int, sys string) error {
	q := b.queues[sys]
	if err := q.reset(ctx); err != nil {
		return err
	}
	keys := makeKeys(fmt.Sprintf("new-%d", r), b.size.Inserts)
	before, cpu := q.trips(), b.cpuSince()
	d, err := b.submitAll(ctx, q, keys, false)
	if err != nil {
		return err
	}
	rt, server := q.trips()-before, cpu()
	if err := checkCount(ctx, q, len(keys)); err != nil {
		return err
	}
	b.res.add(rowInsert, sys, round{tasks: len(keys), elapsed: d, submit: rt, serverCPU: server})
	b.logf("insert    round %d %-13s %8.0f tasks/s", r, sys, rate{len(keys), d}.perSecond())
	return nil
}

// insertDup is the "insert, duplicate key" row: every submit finds the
// task its key already holds.
func (b *bench) insertDup(ctx context.Context, r int, sys string) error {
	q := b.queues[sys]
	if err := q.reset(ctx); err != nil {
		return err
	}
	keys := makeKeys(fmt.Sprintf("dup-%d", r), b.size.Inserts)
	if _, err := b.submitAll(ctx, q, keys, false); err != nil {
		return err
	}
	before, cpu := q.trips(), b.cpuSince()
	d, err := b.submitAll(ctx, q, keys, true)
	if err != nil {
		return err
	}
	rt, server := q.trips()-before, cpu()
	if err := checkCount(ctx, q, len(keys)); err != nil {
		return err
	}
	b.res.add(rowDup, sys, round{tasks: len(keys), elapsed: d, submit: rt, serverCPU: server})
	b.logf("dup       round %d %-13s %8.0f tasks/s", r, sys, rate{len(keys), d}.perSecond())
	return nil
}

// batch is the "batch insert" row: batches of new keys, one call each.
func (b *bench) batch(ctx context.Context, r int, sys string) error {
	q := b.queues[sys]
	if err := q.reset(ctx); err != nil {
		return err
	}
	keys := makeKeys(fmt.Sprintf("batch-%d", r), b.size.Batches*b.size.BatchSize)
	before, cpu := q.trips(), b.cpuSince()
	d, err := parallel(ctx, b.size.BatchClients, b.size.Batches, func(ctx context.Context, i int) error {
		return q.submitMany(ctx, keys[i*b.size.BatchSize:(i+1)*b.size.BatchSize])
	})
	if err != nil {
		return err
	}
	rt, server := q.trips()-before, cpu()
	if err := checkCount(ctx, q, len(keys)); err != nil {
		return err
	}
	b.res.add(rowBatch, sys, round{tasks: len(keys), elapsed: d, submit: rt, serverCPU: server})
	b.logf("batch     round %d %-13s %8.0f tasks/s", r, sys, rate{len(keys), d}.perSecond())
	return nil
}

func workRow(procs int) string  { return fmt.Sprintf("%s%d", rowWork, procs) }
func drainRow(procs int) string { return fmt.Sprintf("%s%d", rowDrain, procs) }

// work is the throughput row: procs worker processes with Slots slots
// each are idle; the clients submit WorkTasks tasks; the time runs from
// the first submit until the database shows all of them completed.
//
// With backlog (the drain row), the tasks are submitted in one batch, in
// one transaction, before the clock starts: it measures the workers alone,
// from the moment a backlog appears until it is done.
func (b *bench) work(ctx context.Context, r int, sys string, procs int, backlog bool) error {
	q := b.queues[sys]
	if err := q.reset(ctx); err != nil {
		return err
	}
	n := b.size.WorkTasks
	if sys == sysRiverDefault {
		n = b.size.WorkTasksSlow
	}
	var workers []*workerProc
	defer func() {
		for _, w := range workers {
			_ = w.stop()
		}
	}()
	for range procs {
		w, err := spawnWorker(ctx, b.exe, sys, b.dsns[sys], b.size.Slots, b.profileDir, nil)
		if err != nil {
			return err
		}
		workers = append(workers, w)
	}
	if !sleep(ctx, b.size.Settle) {
		return ctx.Err()
	}
	row, label := workRow(procs), fmt.Sprintf("work×%d ", procs)
	if backlog {
		row, label = drainRow(procs), fmt.Sprintf("drain×%d", procs)
	}
	keys := makeKeys(fmt.Sprintf("%s-%d", row, r), n)
	before := q.trips()
	submitted := make(chan error, 1)
	if backlog {
		if err := q.submitMany(ctx, keys); err != nil {
			return err
		}
		submitted <- nil
	}
	cpu := b.cpuSince()
	start := time.Now()
	if !backlog {
		go func() {
			_, err := b.submitAll(ctx, q, keys, false)
			submitted <- err
		}()
	}
	deadline := start.Add(2 * time.Minute)
	var polls int64 // the polls' round trips are not the submits'
	for {
		polls++
		_, done, _, err := q.finished(ctx)
		if err != nil {
			return err
		}
		if done == n {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d tasks completed after %v", done, n, time.Since(start))
		}
		select {
		case err := <-submitted:
			if err != nil {
				return err
			}
			submitted = nil // all in; wait for the rest to complete
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	d, server := time.Since(start), cpu()
	if submitted != nil {
		if err := <-submitted; err != nil {
			return err
		}
	}
	submitTrips := q.trips() - before - polls
	total, _, retried, err := q.finished(ctx)
	if err != nil {
		return err
	}
	if total != n || retried != 0 {
		return fmt.Errorf("%d tasks stored (want %d), %d ran more than once", total, n, retried)
	}
	var workerTrips int64
	var workerCPU time.Duration
	for _, w := range workers {
		if err := w.stop(); err != nil {
			return fmt.Errorf("worker: %w", err)
		}
		workerTrips += w.trips
		workerCPU += w.cpu
	}
	workers = nil
	b.res.add(row, sys, round{tasks: n, elapsed: d, submit: submitTrips, worker: workerTrips,
		workerCPU: workerCPU, serverCPU: server})
	b.logf("%s   round %d %-13s %8.0f tasks/s", label, r, sys, rate{n, d}.perSecond())
	return nil
}

// latency is the pickup row: one idle worker process per system; one task
// at a time is submitted, to each system in turn, LatencySlot apart, and
// the time from just before the submit call to the handler's start is a
// sample. The worker reports its start with the wall clock of the same
// machine.
func (b *bench) latency(ctx context.Context, r int) error {
	var mu sync.Mutex
	waiting := map[string]chan time.Time{}
	seen := map[string]int{}
	onStart := func(key string, at time.Time) {
		mu.Lock()
		defer mu.Unlock()
		seen[key]++
		if ch, ok := waiting[key]; ok {
			delete(waiting, key)
			ch <- at
		}
	}
	var workers []*workerProc
	defer func() {
		for _, w := range workers {
			_ = w.stop()
		}
	}()
	order := rotated(r)
	for _, sys := range order {
		if err := b.queues[sys].reset(ctx); err != nil {
			return err
		}
		w, err := spawnWorker(ctx, b.exe, sys, b.dsns[sys], b.size.Slots, b.profileDir, onStart)
		if err != nil {
			return err
		}
		workers = append(workers, w)
	}
	if !sleep(ctx, b.size.Settle) {
		return ctx.Err()
	}
	samples := map[string][]time.Duration{}
	for i := range b.size.LatencySamples * len(order) {
		sys := order[i%len(order)]
		key := fmt.Sprintf("lat-%d-%d", r, i)
		ch := make(chan time.Time, 1)
		mu.Lock()
		waiting[key] = ch
		mu.Unlock()
		start := time.Now()
		if _, err := b.queues[sys].submit(ctx, key); err != nil {
			return fmt.Errorf("%s: %w", sys, err)
		}
		select {
		case at := <-ch:
			samples[sys] = append(samples[sys], at.Sub(start))
		case <-time.After(10 * time.Second):
			return fmt.Errorf("%s: task %s not picked up within 10s", sys, key)
		case <-ctx.Done():
			return ctx.Err()
		}
		if !sleep(ctx, time.Until(start.Add(b.size.LatencySlot))) {
			return ctx.Err()
		}
	}
	for _, w := range workers {
		if err := w.stop(); err != nil {
			return fmt.Errorf("worker: %w", err)
		}
	}
	workers = nil
	mu.Lock()
	defer mu.Unlock()
	for key, n := range seen {
		if n != 1 {
			return fmt.Errorf("task %s started %d times", key, n)
		}
	}
	if len(seen) != b.size.LatencySamples*len(order) {
		return fmt.Errorf("%d tasks started, want %d", len(seen), b.size.LatencySamples*len(order))
	}
	b.res.mu.Lock()
	defer b.res.mu.Unlock()
	for _, sys := range order {
		b.res.latency[sys] = append(b.res.latency[sys], samples[sys]...)
		p50, p99 := percentiles(samples[sys])
		b.logf("latency   round %d %-13s p50 %v p99 %v", r, sys, p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond))
	}
	return nil
}

// percentiles returns the p50 and p99 of samples (nearest rank).
func percentiles(samples []time.Duration) (p50, p99 time.Duration) {
	s := slices.Clone(samples)
	slices.Sort(s)
	return measure.Percentile(s, 0.50), measure.Percentile(s, 0.99)
}

// sleep waits d or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
