package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgate/idemgate/pgstore"
)

// queueCase is one queue the command builds and measures: Tasks
// waiting tasks of kind image, spread over Tenants tenants in turn.
type queueCase struct {
	name    string
	tasks   int
	tenants int
	// perTenant sets MaxRunningPerTenant 1 on the kind; capped of the
	// tenants (the first ones) then run one attempt each already, held
	// by another worker, so their waiting tasks cannot be claimed.
	perTenant bool
	capped    int
	// others: with every tenant capped, otherTenants more tenants have
	// one task each waiting, so that a claim has something to take past
	// the capped tenants (as many tenants as two claims take).
	others bool
	// scheduled tasks of the tenant "planner" wait for tomorrow; its
	// Submits are the timed ones (due tasks, beside its own backlog).
	scheduled int
	large     bool // the 2× target
	base      int  // index of the case it is compared with
}

// otherTenants are the tenants beside the capped ones whose tasks the
// claims take when every other tenant is capped: twice a claim's 16, so
// that a claim finds 16 whose last task has finished.
const otherTenants = 32

// queueCases are the rows of the queue's table, built from sz.
func queueCases(sz sizes) []queueCase {
	cs := []queueCase{{name: fmt.Sprintf("small queue (the baseline, beside a copy of itself): %d tasks, %d tenants", sz.Small, sz.SmallTenants),
		tasks: sz.Small, tenants: sz.SmallTenants}}
	for i, n := range sz.Backlogs {
		cs = append(cs, queueCase{name: fmt.Sprintf("backlog %s, %s", count(n), tenants(sz.BacklogTenants)),
			tasks: n, tenants: sz.BacklogTenants, large: i == len(sz.Backlogs)-1 && n >= 1_000_000})
	}
	for _, tn := range sz.Tenants {
		if tn == sz.BacklogTenants && slices.Contains(sz.Backlogs, sz.TenantsBacklog) {
			continue // that row is above
		}
		cs = append(cs, queueCase{name: fmt.Sprintf("backlog %s, %s", count(sz.TenantsBacklog), tenants(tn)),
			tasks: sz.TenantsBacklog, tenants: tn})
	}
	limitedBase := len(cs)
	cs = append(cs, queueCase{name: "small queue, per-tenant limit 1 (the limited rows' baseline, beside a copy of itself)",
		tasks: sz.Small, tenants: sz.SmallTenants, perTenant: true, base: limitedBase})
	for _, pct := range sz.Capped {
		c := queueCase{name: fmt.Sprintf("%s tenants × %d, per-tenant limit 1, %d %% capped", count(sz.CappedTenants), sz.CappedEach, pct),
			tasks: sz.CappedTenants * sz.CappedEach, tenants: sz.CappedTenants, perTenant: true,
			capped: sz.CappedTenants * pct / 100, base: limitedBase}
		if c.capped == c.tenants {
			c.others = true
			c.name += fmt.Sprintf(": claims take the tasks of %d other tenants, one task each", otherTenants)
		}
		cs = append(cs, c)
	}
	cs = append(cs, queueCase{name: fmt.Sprintf("small queue beside %s tasks a tenant scheduled for tomorrow (Submit: that tenant's)", count(sz.Scheduled)),
		tasks: sz.Small, tenants: sz.SmallTenants, scheduled: sz.Scheduled})
	return cs
}

// queueResult is what one queue measured.
type queueResult struct {
	claims, submits latencies
}

// measureQueue builds each queue case and writes its table. Each case is
// measured beside a fresh copy of its baseline, at the same time: their
// workers claim side by side and their Submits alternate, so both see
// the same load, and the ratio is the queue's, not the minute's (on a
// shared machine the load moves by several times within a run).
func measureQueue(ctx context.Context, out, log io.Writer, pg *postgres, sz sizes) error {
	cases := queueCases(sz)
	fmt.Fprintf(out, "pgstore: claims of a worker of 16 slots (WorkerClaimed's Latency; a no-op handler replaces each task it runs) and Submits of a new task of a tenant with a backlog, %d of each; each queue beside a copy of its baseline (the small queue; for the limited rows the small queue with the limit), measured at the same time\n\n", sz.Samples)
	fmt.Fprintln(out, "| queue | claim p50 / p99 ms | baseline's | ratio (p50) | Submit p50 / p99 ms | baseline's | ratio (p50) | target | load |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|---|---|---|")
	var uncapped, capped float64
	for _, c := range cases {
		start := time.Now()
		r, b, err := measurePair(ctx, log, pg, c, cases[c.base], sz.Samples)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		fmt.Fprintf(log, "scale: %s measured in %v\n", c.name, time.Since(start).Round(time.Second))
		c50, s50 := r.claims.p(0.5), r.submits.p(0.5)
		cr, sr := ratio(c50, b.claims.p(0.5)), ratio(s50, b.submits.p(0.5))
		target := 1.5
		if c.large {
			target = 2
		}
		fmt.Fprintf(out, "| %s | %s / %s | %s / %s | %.2f× | %s / %s | %s / %s | %.2f× | %s | %s |\n", c.name,
			ms(c50), ms(r.claims.p(0.99)), ms(b.claims.p(0.5)), ms(b.claims.p(0.99)), cr,
			ms(s50), ms(r.submits.p(0.99)), ms(b.submits.p(0.5)), ms(b.submits.p(0.99)), sr,
			verdict(max(cr, sr), target), loadAvg())
		switch {
		case c.perTenant && c.capped == 0 && c.tasks > sz.Small:
			uncapped = cr
		case c.others:
			capped = cr
		}
	}
	if uncapped > 0 && capped > 0 {
		fmt.Fprintf(out, "\ncapped claim against the uncapped one (their ratios to the limited baseline, every tenant capped vs none): %.2f×, %s\n",
			capped/uncapped, verdict(capped/uncapped, 2))
	}
	fmt.Fprintln(out)
	return nil
}

// measurePair builds c's queue and base's, each in a database of its
// own, times the claims of a worker on each (both at once), then their
// Submits, alternately.
func measurePair(ctx context.Context, log io.Writer, pg *postgres, c, base queueCase, samples int) (r, b queueResult, err error) {
	var (
		bq   *queue
		berr error
		wg   sync.WaitGroup
	)
	wg.Go(func() { bq, berr = buildQueue(ctx, log, pg, base) })
	q, err := buildQueue(ctx, log, pg, c)
	wg.Wait()
	if q != nil {
		defer q.close()
	}
	if bq != nil {
		defer bq.close()
	}
	if err == nil && berr != nil {
		err = fmt.Errorf("its baseline: %w", berr)
	}
	if err != nil {
		return r, b, err
	}
	var reached sync.WaitGroup
	reached.Add(2)
	stop := make(chan struct{})
	go func() { reached.Wait(); close(stop) }()
	wg.Go(func() { b.claims, berr = timeClaims(ctx, bq.s, base, samples, reached.Done, stop) })
	r.claims, err = timeClaims(ctx, q.s, c, samples, reached.Done, stop)
	wg.Wait()
	if err == nil && berr != nil {
		err = fmt.Errorf("its baseline: %w", berr)
	}
	if err != nil {
		return r, b, err
	}
	for i := range warmup(samples) + samples {
		for _, side := range []struct {
			q   *queue
			res *queueResult
		}{{q, &r}, {bq, &b}} {
			begin := time.Now()
			if _, err := side.q.s.Submit(ctx, newTask(side.q.submitter(), fmt.Sprintf("probe-%d", i))); err != nil {
				return r, b, err
			}
			if i >= warmup(samples) {
				side.res.submits = append(side.res.submits, time.Since(begin))
			}
		}
	}
	return r, b, nil
}

// queue is a built queue case.
type queue struct {
	c      queueCase
	s      *pgstore.Store
	closes []func()
}

func (q *queue) close() {
	for _, f := range slices.Backward(q.closes) {
		f()
	}
}

// submitter is the tenant whose Submits are timed: one with a backlog.
func (q *queue) submitter() string {
	if q.c.scheduled > 0 {
		return "planner"
	}
	return "tenant-0"
}

// buildQueue builds c's queue in a database of its own.
func buildQueue(ctx context.Context, log io.Writer, pg *postgres, c queueCase) (_ *queue, err error) {
	pool, drop, err := pg.database(ctx)
	if err != nil {
		return nil, err
	}
	q := &queue{c: c, closes: []func(){drop}}
	defer func() {
		if err != nil {
			q.close()
		}
	}()
	if q.s, err = pgstore.New(ctx, pool); err != nil {
		return nil, err
	}
	if c.perTenant {
		if err := q.s.SetKindLimits(ctx, "image", pgstore.KindLimits{MaxRunningPerTenant: 1}); err != nil {
			return nil, err
		}
	}
	if c.capped > 0 {
		stopHolder, err := holdTenants(ctx, q.s, c.capped)
		if err != nil {
			return nil, fmt.Errorf("hold the capped tenants: %w", err)
		}
		q.closes = append(q.closes, stopHolder)
	}
	began := time.Now()
	if err := submitAll(ctx, q.s, c.tasks, func(g int) pgstore.NewTask {
		return newTask(fmt.Sprintf("tenant-%d", g%c.tenants), fmt.Sprintf("b-%d", g))
	}); err != nil {
		return nil, err
	}
	if c.others {
		if err := submitAll(ctx, q.s, otherTenants, func(g int) pgstore.NewTask {
			return newTask(fmt.Sprintf("other-%d", g), fmt.Sprintf("o-%d", g))
		}); err != nil {
			return nil, err
		}
	}
	later := time.Now().Add(24 * time.Hour)
	if err := submitAll(ctx, q.s, c.scheduled, func(g int) pgstore.NewTask {
		t := newTask("planner", fmt.Sprintf("s-%d", g))
		t.RunAfter = later
		return t
	}); err != nil {
		return nil, err
	}
	// As autovacuum would leave a queue this size: statistics gathered.
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE idemgate_tasks"); err != nil {
		return nil, err
	}
	if c.tasks+c.scheduled >= 10_000 {
		fmt.Fprintf(log, "scale: %d tasks (%d scheduled) submitted in %v (load %s)\n", c.tasks+c.scheduled, c.scheduled,
			time.Since(began).Round(time.Second), loadAvg())
	}
	return q, nil
}

func newTask(tenant, key string) pgstore.NewTask {
	return pgstore.NewTask{Tenant: tenant, Owner: "o", Kind: "image", Runtime: "gpu", Network: "main",
		IdempotencyKey: key, Fingerprint: "f"}
}

// submitAll stores n tasks made by task with SubmitMany, in batches, on
// two connections.
func submitAll(ctx context.Context, s *pgstore.Store, n int, task func(g int) pgstore.NewTask) error {
	const batch = 2000
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	next := make(chan int)
	for range 2 {
		wg.Go(func() {
			for from := range next {
				if err := submitBatch(ctx, s, from, min(n, from+batch), task); err != nil {
					once.Do(func() { firstErr = err; cancel() })
				}
			}
		})
	}
	for from := 0; from < n && ctx.Err() == nil; from += batch {
		next <- from
	}
	close(next)
	wg.Wait()
	return firstErr
}

func submitBatch(ctx context.Context, s *pgstore.Store, from, to int, task func(g int) pgstore.NewTask) error {
	ts := make([]pgstore.NewTask, 0, to-from)
	for i := from; i < to; i++ {
		ts = append(ts, task(i))
	}
	res, err := s.SubmitMany(ctx, ts)
	if err != nil {
		return err
	}
	for _, r := range res {
		if r.Err != nil || r.Task.Duplicate {
			return fmt.Errorf("submit: %v (duplicate %t)", r.Err, r.Task.Duplicate)
		}
	}
	return nil
}

// holdTenants makes tenants tenant-0 … tenant-(n-1) each run one attempt,
// held by a worker of its own until the returned stop: one task each,
// claimed before anything else is submitted.
func holdTenants(ctx context.Context, s *pgstore.Store, n int) (stop func(), err error) {
	if err := submitAll(ctx, s, n, func(g int) pgstore.NewTask {
		return newTask(fmt.Sprintf("tenant-%d", g), fmt.Sprintf("held-%d", g))
	}); err != nil {
		return nil, err
	}
	var claimed atomic.Int64
	all := make(chan struct{})
	w, err := pgstore.NewWorker(s, pgstore.WorkerConfig{
		Name: "holder", Kinds: []string{"image"}, Concurrency: n, Lease: 10 * time.Minute,
		ShutdownTimeout: time.Second,
		Handler: func(ctx context.Context, _ pgstore.Task) pgstore.Outcome {
			<-ctx.Done()
			return pgstore.Retry(0, ctx.Err())
		},
		OnEvent: func(ev pgstore.WorkerEvent) {
			if ev.Type == pgstore.WorkerClaimed && claimed.Add(1) == int64(n) {
				close(all)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	stop = func() { cancel(); <-done }
	select {
	case <-all:
		return stop, nil
	case err := <-done:
		cancel()
		return nil, fmt.Errorf("holder stopped: %w", err)
	case <-time.After(2 * time.Minute):
		stop()
		return nil, fmt.Errorf("the holder claimed %d of %d tasks in 2 minutes", claimed.Load(), n)
	case <-ctx.Done():
		stop()
		return nil, ctx.Err()
	}
}

// timeClaims runs a worker of 16 slots on c's queue and returns the
// latencies of its first samples claims (after a warm-up) as the worker
// measured them. It calls enough once it has them (or has failed), and
// keeps the worker running until stop is closed, so that the queue
// measured beside it has its own samples taken beside a running worker
// too. Its handler submits a replacement for each task, so the queue
// keeps its size.
func timeClaims(ctx context.Context, s *pgstore.Store, c queueCase, samples int, enough func(), stop <-chan struct{}) (latencies, error) {
	var once sync.Once
	reached := func() { once.Do(enough) }
	defer reached()
	want := warmup(samples) + samples
	var (
		mu     sync.Mutex
		claims latencies
		last   time.Duration
		subErr error
	)
	var n atomic.Int64
	w, err := pgstore.NewWorker(s, pgstore.WorkerConfig{
		Name: "scale", Kinds: []string{"image"}, Concurrency: 16, PollInterval: 100 * time.Millisecond,
		ShutdownTimeout: 2 * time.Second,
		Handler: func(ctx context.Context, t pgstore.Task) pgstore.Outcome {
			if _, err := s.Submit(ctx, newTask(t.Tenant, fmt.Sprintf("r-%d", n.Add(1)))); err != nil && ctx.Err() == nil {
				mu.Lock()
				subErr = err
				mu.Unlock()
			}
			return pgstore.Succeeded(json.RawMessage(`1`))
		},
		OnEvent: func(ev pgstore.WorkerEvent) {
			if ev.Type != pgstore.WorkerClaimed {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			// A claim of k tasks emits k events in a row, each with the
			// claim's latency.
			if ev.Latency == last {
				return
			}
			last = ev.Latency
			claims = append(claims, ev.Latency)
			if len(claims) == want {
				reached()
			}
		},
	})
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	timeout := time.After(2*time.Minute + time.Duration(want)*100*time.Millisecond)
	select {
	case <-stop:
	case err := <-done:
		cancel()
		return nil, fmt.Errorf("worker stopped: %w", err)
	case <-timeout:
	case <-ctx.Done():
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	if subErr != nil {
		return nil, fmt.Errorf("a replacement's submit: %w", subErr)
	}
	if len(claims) < want {
		return nil, fmt.Errorf("the worker made %d claims, want %d", len(claims), want)
	}
	return claims[warmup(samples):want], ctx.Err()
}

// count writes n as 10k, 1M, or in full with thousands separated.
func count(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 10_000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	case n >= 1000:
		return fmt.Sprintf("%d,%03d", n/1000, n%1000)
	}
	return fmt.Sprint(n)
}

func tenants(n int) string {
	if n == 1 {
		return "1 tenant"
	}
	return count(n) + " tenants"
}
