package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/pgstore"
	"github.com/idemgate/idemgate/tools/internal/measure"
)

// scenario is one kind of traffic.
type scenario struct {
	name string
	// seed is true when the keys are submitted once, unmeasured, first.
	seed bool
	// body is the request body for the measured requests.
	body []byte
	// group is true when clients send the same key in groups at once.
	group bool
}

var (
	baseBody  = []byte(`{"prompt":"a lighthouse at dusk, oil on canvas","aspect_ratio":"16:9","n":1,"client_note":"loadtest"}`)
	driftBody = []byte(`{"prompt":"a lighthouse at dawn, oil on canvas","aspect_ratio":"16:9","n":1,"client_note":"loadtest"}`)

	scenarioByName = map[string]scenario{
		"miss":     {name: "miss", body: baseBody},
		"replay":   {name: "replay", seed: true, body: baseBody},
		"conflict": {name: "conflict", seed: true, body: driftBody},
		"dup":      {name: "dup", body: baseBody, group: true},
	}
)

// bench runs scenarios against the stacks of one env.
type bench struct {
	env    *env
	o      options
	log    io.Writer
	tty    bool
	runID  int64
	stacks []*stack
	client *http.Client
}

func newBench(e *env, o options, log io.Writer) *bench {
	tty := false
	if f, ok := log.(*os.File); ok {
		if fi, err := f.Stat(); err == nil {
			tty = fi.Mode()&os.ModeCharDevice != 0
		}
	}
	return &bench{
		env: e, o: o, log: log, tty: tty, runID: time.Now().Unix(),
		client: &http.Client{
			Timeout: 30 * time.Second,
			Transport: &http.Transport{
				MaxIdleConns:        4 * o.concurrency,
				MaxIdleConnsPerHost: 4 * o.concurrency,
				IdleConnTimeout:     time.Minute,
				DisableCompression:  true,
			},
		},
	}
}

// stackOrder is every stack, as the report shows them: each floor before
// the stacks compared to it.
var stackOrder = []string{floorName, floorScriptName, idemgateName, idemgateHTTPName, pgFloorName, idemgatePGName, idemgatePGAtomicName}

// start builds the stacks that -stacks names. Every stack writes tasks to
// pgstore's table, so that is migrated first; the pg-floor's table copies
// pgrecords' shape, so that one is migrated before the floor's is made.
func (b *bench) start(ctx context.Context) error {
	tasks, err := pgstore.New(ctx, b.env.db)
	if err != nil {
		return fmt.Errorf("pgstore: %w", err)
	}
	if err := tasks.Migrate(ctx); err != nil {
		return fmt.Errorf("pgstore migrate: %w", err)
	}
	b.env.closers = append(b.env.closers, b.cleanup)
	if b.o.pgWrite == pgWriteLedger {
		if err := createLedgerTable(ctx, b.env.db); err != nil {
			return err
		}
	}
	for _, name := range b.o.stacks {
		var st *stack
		switch name {
		case floorName, floorScriptName:
			st, err = newFloor(ctx, b.env, b.o, name == floorName)
		case idemgateName:
			st, err = newIdemgate(ctx, b.env, b.o)
		case idemgateHTTPName:
			st, err = newIdemgateHTTP(ctx, b.env, b.o)
		case pgFloorName:
			if err = b.migrateRecords(ctx); err == nil {
				if err = createPGFloorTable(ctx, b.env.db); err == nil {
					st, err = newPGFloor(ctx, b.env, b.o)
				}
			}
		case idemgatePGName, idemgatePGAtomicName:
			st, err = newIdemgatePG(ctx, b.env, b.o, name == idemgatePGAtomicName)
		default:
			err = fmt.Errorf("unknown stack %q", name)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		b.env.closers = append(b.env.closers, st.close)
		b.stacks = append(b.stacks, st)
	}
	return nil
}

func (b *bench) migrateRecords(ctx context.Context) error {
	records, err := pgrecords.New(ctx, b.env.db)
	if err != nil {
		return fmt.Errorf("pgrecords: %w", err)
	}
	if err := records.Migrate(ctx); err != nil {
		return fmt.Errorf("pgrecords migrate: %w", err)
	}
	return nil
}

// cleanup removes this run's rows (every stack's tasks, idemgate-pg's
// records) and the pg-floor's and the ledger's tables, for runs against a database given by
// -database-url (a throwaway one is removed anyway).
func (b *bench) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := b.env.db.Exec(ctx, `DELETE FROM `+tasksTable+` WHERE tenant LIKE $1`,
		fmt.Sprintf("lt-%%-%d", b.runID)); err != nil {
		fmt.Fprintf(b.log, "loadtest: remove this run's tasks: %v\n", err)
	}
	if slices.Contains(b.o.stacks, idemgatePGName) || slices.Contains(b.o.stacks, idemgatePGAtomicName) {
		// keyspace keys start with idem:<tenant>: and the run's tenants
		// (lt-<scenario>-<stack>-<run>) need no escaping.
		if _, err := b.env.db.Exec(ctx, `DELETE FROM `+recordsTable+` WHERE key LIKE $1`,
			fmt.Sprintf("idem:lt-%%-%d:%%", b.runID)); err != nil {
			fmt.Fprintf(b.log, "loadtest: remove this run's records: %v\n", err)
		}
	}
	if slices.Contains(b.o.stacks, pgFloorName) {
		if _, err := b.env.db.Exec(ctx, `DROP TABLE IF EXISTS `+pgFloorTable); err != nil {
			fmt.Fprintf(b.log, "loadtest: drop %s: %v\n", pgFloorTable, err)
		}
	}
	if b.o.pgWrite == pgWriteLedger {
		if _, err := b.env.db.Exec(ctx, `DROP TABLE IF EXISTS `+ledgerTable); err != nil {
			fmt.Fprintf(b.log, "loadtest: drop %s: %v\n", ledgerTable, err)
		}
	}
}

// outcome is what one client saw.
type outcome struct {
	lat      []time.Duration
	status   map[int]int64
	errors   int64
	accepted map[string]string // key → task id of a 2xx
	mismatch int64             // a 2xx for a key with another task id than before
}

func newOutcome() *outcome {
	return &outcome{status: map[int]int64{}, accepted: map[string]string{}}
}

func (o *outcome) merge(p *outcome) {
	o.lat = append(o.lat, p.lat...)
	for s, n := range p.status {
		o.status[s] += n
	}
	o.errors += p.errors
	o.mismatch += p.mismatch
	for k, id := range p.accepted {
		o.note(k, id)
	}
}

func (o *outcome) note(key, id string) {
	if prev, ok := o.accepted[key]; ok && prev != id {
		o.mismatch++
		return
	}
	o.accepted[key] = id
}

// do sends one POST /v1/images and records it. fresh says that the key is
// new (only the pg-floor reads it; every stack gets the header).
func (b *bench) do(ctx context.Context, st *stack, tenant, key string, body []byte, fresh, slow bool, out *outcome) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, st.url+"/v1/images", bytes.NewReader(body))
	if err != nil {
		out.errors++
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Tenant", tenant)
	req.Header.Set("X-User", "user-1")
	if fresh {
		req.Header.Set(expectHeader, "new")
	}
	if slow {
		req.Header.Set(slowHeader, b.o.slow.String())
	}
	start := time.Now()
	resp, err := b.client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			out.errors++
		}
		return
	}
	respBody, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	out.lat = append(out.lat, time.Since(start))
	if err != nil {
		out.errors++
		return
	}
	out.status[resp.StatusCode]++
	if resp.StatusCode/100 == 2 {
		out.note(key, taskID(respBody))
	}
}

// taskID extracts "task_id":"…" without a JSON decode, to keep the client cheap.
func taskID(body []byte) string {
	const field = `"task_id":"`
	i := bytes.Index(body, []byte(field))
	if i < 0 {
		return ""
	}
	rest := body[i+len(field):]
	if j := bytes.IndexByte(rest, '"'); j >= 0 {
		return string(rest[:j])
	}
	return ""
}

// warm sends new keys for -warmup, unmeasured.
func (b *bench) warm(ctx context.Context, st *stack) error {
	if b.o.warmup <= 0 {
		return nil
	}
	tenant := fmt.Sprintf("lt-warm-%s-%d", st.name, b.runID)
	b.drive(ctx, st, scenarioByName["miss"], tenant, "w", b.o.warmup, "warm-up")
	st.execs.reset()
	return ctx.Err()
}

// seedKey names the k-th prepared key.
func seedKey(k int) string { return "seed-" + strconv.Itoa(k) }

// seed submits each prepared key once with the base body.
func (b *bench) seed(ctx context.Context, st *stack, tenant string) *outcome {
	out := newOutcome()
	var mu sync.Mutex
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < b.o.concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := newOutcome()
			for {
				k := int(next.Add(1)) - 1
				if k >= b.o.keys || ctx.Err() != nil {
					break
				}
				b.do(ctx, st, tenant, seedKey(k), baseBody, true, false, mine)
			}
			mu.Lock()
			out.merge(mine)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// drive runs the scenario's clients against st for d and returns what they saw.
// New keys are named prefix + client + sequence, so every call needs its own prefix.
func (b *bench) drive(ctx context.Context, st *stack, sc scenario, tenant, prefix string, d time.Duration, label string) (*outcome, time.Duration) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	deadline := time.Now().Add(d)
	var done atomic.Int64
	out := newOutcome()
	var mu sync.Mutex
	finish := func(mine *outcome) {
		mu.Lock()
		out.merge(mine)
		mu.Unlock()
	}
	stopProgress := b.progress(label, st.name, d, &done)
	start := time.Now()
	var wg sync.WaitGroup
	if sc.group {
		groups := b.o.concurrency / b.o.dupGroup
		for g := 0; g < groups; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				b.group(ctx, st, sc, tenant, prefix+strconv.Itoa(g), deadline, &done, finish)
			}()
		}
	} else {
		for w := 0; w < b.o.concurrency; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				mine := newOutcome()
				mine.lat = make([]time.Duration, 0, 4096)
				for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
					var key string
					if sc.seed {
						key = seedKey((w*7919 + i) % b.o.keys)
					} else {
						key = prefix + strconv.Itoa(w) + "-" + strconv.Itoa(i)
					}
					b.do(ctx, st, tenant, key, sc.body, !sc.seed, false, mine)
					done.Add(1)
				}
				finish(mine)
			}()
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	stopProgress()
	return out, elapsed
}

// group sends one new key from dupGroup clients at the same instant, round
// after round, to a handler slowed by -slow.
func (b *bench) group(ctx context.Context, st *stack, sc scenario, tenant, prefix string, deadline time.Time, done *atomic.Int64, finish func(*outcome)) {
	mine := make([]*outcome, b.o.dupGroup)
	for i := range mine {
		mine[i] = newOutcome()
	}
	for round := 0; time.Now().Before(deadline) && ctx.Err() == nil; round++ {
		key := prefix + "-" + strconv.Itoa(round)
		release := make(chan struct{})
		var wg sync.WaitGroup
		for i := range mine {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-release
				b.do(ctx, st, tenant, key, sc.body, true, true, mine[i])
				done.Add(1)
			}()
		}
		close(release)
		wg.Wait()
	}
	for _, m := range mine {
		finish(m)
	}
}

// progress prints a progress line every half second until stopped.
func (b *bench) progress(label, stack string, d time.Duration, done *atomic.Int64) (stop func()) {
	start := time.Now()
	quit := make(chan struct{})
	var wg sync.WaitGroup
	line := func() string {
		el := time.Since(start)
		n := done.Load()
		return fmt.Sprintf("%-9s %-9s %5.1fs/%-5s %9d req %9.0f req/s", label, stack,
			el.Seconds(), d, n, float64(n)/el.Seconds())
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				if b.tty {
					fmt.Fprintf(b.log, "\r%s", line())
				}
			}
		}
	}()
	return func() {
		close(quit)
		wg.Wait()
		if b.tty {
			fmt.Fprintf(b.log, "\r%s\n", line())
		} else {
			fmt.Fprintln(b.log, line())
		}
	}
}

// tally is what one stack saw over the rounds of a scenario.
type tally struct {
	tenant  string
	seen    *outcome // seeding and measured requests
	out     *outcome // measured requests
	elapsed time.Duration
	rt      int64
	cmds    map[string]int64 // INFO commandstats calls
	usec    map[string]int64 // and time inside Redis
	execs   int64
	created int64
	dupExec int64
	rounds  []round // each round's figures, for the HTML report
	// Redis server figures over the measured rounds.
	cpu       float64 // seconds of used_cpu_sys + used_cpu_user
	memory    int64   // used_memory delta
	keysAdded int64   // DBSIZE delta
	// Postgres figures over the measured rounds.
	pgCPU time.Duration // the whole server's
	// This process's CPU (clients and servers) over the measured rounds.
	selfCPU time.Duration
	pgRT    int64 // the stack's records pool's
}

// scenario measures sc on every stack: -rounds short runs per stack,
// alternating stacks (and which goes first) so that both meet the same
// background load; the figures add up over the rounds.
func (b *bench) scenario(ctx context.Context, sc scenario) ([]*result, error) {
	tallies := make([]*tally, len(b.stacks))
	for i, st := range b.stacks {
		tl := &tally{tenant: fmt.Sprintf("lt-%s-%s-%d", sc.name, st.name, b.runID), seen: newOutcome(), out: newOutcome(), cmds: map[string]int64{}, usec: map[string]int64{}}
		if sc.seed {
			tl.seen = b.seed(ctx, st, tl.tenant)
			if ok := tl.seen.status[202]; ok != int64(b.o.keys) {
				return nil, fmt.Errorf("%s %s: seeding %d keys got statuses %v, %d transport errors",
					sc.name, st.name, b.o.keys, tl.seen.status, tl.seen.errors)
			}
		}
		tallies[i] = tl
	}
	per := b.o.duration / time.Duration(b.o.rounds)
	for round := 0; round < b.o.rounds; round++ {
		for k := range b.stacks {
			i := k
			if round%2 == 1 {
				i = len(b.stacks) - 1 - k
			}
			if err := b.measure(ctx, sc, b.stacks[i], tallies[i], round, per); err != nil {
				return nil, err
			}
		}
	}
	results := make([]*result, len(b.stacks))
	for i, st := range b.stacks {
		res, err := b.result(ctx, sc, st, tallies[i])
		if err != nil {
			return nil, err
		}
		results[i] = res
	}
	return results, nil
}

// adminCommand names the commands the load tool itself sends (INFO, DBSIZE)
// and a cluster client's slot map refreshes: not a stack's.
var adminCommand = map[string]bool{"info": true, "dbsize": true, "cluster|slots": true, "cluster|shards": true, "cluster": true}

// measure runs one round of sc on st and adds it to tl.
func (b *bench) measure(ctx context.Context, sc scenario, st *stack, tl *tally, round int, d time.Duration) error {
	st.execs.reset()
	rtBefore := st.rt.n.Load()
	before, err := commandStats(ctx, b.env.admin)
	if err != nil {
		return err
	}
	srvBefore, err := serverFigures(ctx, b.env.admin)
	if err != nil {
		return err
	}
	pgBefore, err := b.pgCPU()
	if err != nil {
		return err
	}
	selfBefore := processCPU()
	pgrtBefore := st.pgrt.Load()
	label := sc.name
	if b.o.rounds > 1 {
		label = fmt.Sprintf("%s %d/%d", sc.name, round+1, b.o.rounds)
	}
	out, elapsed := b.drive(ctx, st, sc, tl.tenant, "r"+strconv.Itoa(round)+"-", d, label)
	if err := ctx.Err(); err != nil {
		return err
	}
	pgrtAfter := st.pgrt.Load()
	selfAfter := processCPU()
	pgAfter, err := b.pgCPU()
	if err != nil {
		return err
	}
	srvAfter, err := serverFigures(ctx, b.env.admin)
	if err != nil {
		return err
	}
	after, err := commandStats(ctx, b.env.admin)
	if err != nil {
		return err
	}
	tl.cpu += srvAfter.cpu - srvBefore.cpu
	tl.memory += srvAfter.memory - srvBefore.memory
	tl.keysAdded += srvAfter.keys - srvBefore.keys
	tl.rt += st.rt.n.Load() - rtBefore
	tl.pgCPU += pgAfter - pgBefore
	tl.selfCPU += selfAfter - selfBefore
	tl.pgRT += pgrtAfter - pgrtBefore
	for cmd, c := range after {
		if delta := c.calls - before[cmd].calls; delta > 0 && !adminCommand[cmd] {
			tl.cmds[cmd] += delta
			tl.usec[cmd] += c.usec - before[cmd].usec
		}
	}
	execs, created, dupExecs := st.execs.reset()
	tl.execs += execs
	tl.created += created
	tl.dupExec += dupExecs
	tl.elapsed += elapsed
	tl.rounds = append(tl.rounds, newRound(round, out.lat, elapsed))
	tl.out.merge(out)
	return nil
}

// processCPU returns this process's CPU time so far (user + system, all
// threads; 0 where getrusage is missing).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pgCPU reads the Postgres server's CPU time so far (0 when it is not
// measured).
func (b *bench) pgCPU() (time.Duration, error) {
	if b.env.pgServer == nil {
		return 0, nil
	}
	d, err := b.env.pgServer.Used()
	if err != nil {
		return 0, fmt.Errorf("postgres CPU: %w", err)
	}
	return d, nil
}

// result turns a stack's tally into figures, counting its rows.
func (b *bench) result(ctx context.Context, sc scenario, st *stack, tl *tally) (*result, error) {
	out := tl.out
	res := &result{
		Scenario: sc.name, Stack: st.name, Floor: st.floor, Records: "redis",
		Requests: int64(len(out.lat)), TransportErrors: out.errors,
		Seconds:             tl.elapsed.Seconds(),
		Status:              map[string]int64{},
		HandlerExecutions:   tl.execs,
		DuplicateExecutions: tl.dupExec,
		RowsCreated:         tl.created,
		RedisCommands:       map[string]float64{},
		RedisUsec:           map[string]float64{},
		Rounds:              tl.rounds,
	}
	if st.pgrt != nil {
		res.Records = "postgres"
	}
	res.ReqPerSec = float64(res.Requests) / tl.elapsed.Seconds()
	for s, n := range out.status {
		res.Status[strconv.Itoa(s)] = n
	}
	slices.Sort(out.lat)
	res.P50ms, res.P99ms, res.P999ms = pct(out.lat, 0.50), pct(out.lat, 0.99), pct(out.lat, 0.999)
	if res.Requests > 0 {
		n := float64(res.Requests)
		res.RedisRoundTripsPerReq = float64(tl.rt) / n
		var calls int64
		for cmd, c := range tl.cmds {
			calls += c
			res.RedisCommands[cmd] = float64(c) / n
			res.RedisUsec[cmd] = float64(tl.usec[cmd]) / float64(c)
		}
		res.RedisCallsPerReq = float64(calls) / n
		res.RedisCPUusPerReq = tl.cpu * 1e6 / n
		if st.pgrt != nil {
			res.PGRoundTripsPerReq = float64(tl.pgRT) / n
		}
		if b.env.pgServer != nil {
			res.PGCPUusPerReq = float64(tl.pgCPU.Nanoseconds()) / 1e3 / n
		}
		res.ProcessCPUusPerReq = float64(tl.selfCPU.Nanoseconds()) / 1e3 / n
		// Only rounds that added many keys say what a record costs.
		if tl.keysAdded > 1000 {
			res.RedisBytesPerRecord = float64(tl.memory) / float64(tl.keysAdded)
		}
	}
	tl.seen.merge(out)
	res.TaskIDMismatches = tl.seen.mismatch
	res.AcceptedKeys = int64(len(tl.seen.accepted))
	if err := b.env.db.QueryRow(ctx,
		`SELECT count(*), count(*) - count(DISTINCT `+st.keyCol+`) FROM `+st.table+` WHERE tenant = $1`,
		tl.tenant).Scan(&res.Rows, &res.DuplicateRows); err != nil {
		return nil, fmt.Errorf("count rows: %w", err)
	}
	if res.AcceptedKeys > 0 {
		res.RowsPerAcceptedKey = float64(res.Rows) / float64(res.AcceptedKeys)
	}
	return res, nil
}

// pct is the nearest-rank p-quantile of sorted latencies, in milliseconds.
func pct(sorted []time.Duration, p float64) float64 {
	return float64(measure.Percentile(sorted, p).Microseconds()) / 1000
}
