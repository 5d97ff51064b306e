package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/pgtrace"
	"github.com/idemgate/idemgate/internal/wait"
)

// benchClients is how many goroutines drive the throughput benchmarks.
const benchClients = 16

// benchConcurrency is the worker concurrency of BenchmarkClaimComplete.
const benchConcurrency = 64

// benchStore is a migrated store whose pool of conns connections counts
// its round trips (a statement each, a batch once). The connections are
// open before the benchmark starts.
func benchStore(b *testing.B, conns int) (*Store, *pgtrace.RoundTrips) {
	b.Helper()
	db := newTestDB(b)
	cfg, err := pgxpool.ParseConfig(db.dsn)
	if err != nil {
		b.Fatal(err)
	}
	counter := &pgtrace.RoundTrips{}
	cfg.ConnConfig.Tracer = counter
	cfg.MaxConns = int32(conns)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	held := make([]*pgxpool.Conn, conns)
	for i := range held {
		if held[i], err = pool.Acquire(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range held {
		c.Release()
	}
	s, err := New(context.Background(), pool)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	return s, counter
}

// parallel runs fn(i) for i in [0, n) on benchClients goroutines and
// returns the elapsed time.
func parallel(b *testing.B, n int, fn func(i int) error) time.Duration {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	start := time.Now()
	for range benchClients {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err, ok := failed.Load().(error); ok {
		b.Fatal(err)
	}
	return time.Since(start)
}

// BenchmarkSubmitNewKey compares Submit of new keys with its floor: a
// plain single-row INSERT of the same row into a copy of the table with
// the same indexes and no trigger. Both run with benchClients clients,
// alternating in rounds so that drift hits both alike.
func BenchmarkSubmitNewKey(b *testing.B) {
	s, _ := benchStore(b, benchClients)
	ctx := context.Background()
	if _, err := s.pool.Exec(ctx, "CREATE TABLE bench_floor (LIKE idemgate_tasks INCLUDING ALL)"); err != nil {
		b.Fatal(err)
	}
	// The floor's row carries a turn, as Submit's does: without one its
	// entries in the three indexes that hold the turn are equal keys,
	// which B-tree deduplication stores as posting lists, and the floor
	// would be a cheaper row, not the same row without the queue's logic.
	const floorSQL = `INSERT INTO bench_floor
	(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, params, turn)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`
	params := []byte(`{"prompt":"a cat in a hat","n":1}`)
	var turn atomic.Int64
	insert := func(r int) func(i int) error {
		return func(i int) error {
			_, err := s.pool.Exec(ctx, floorSQL, "acme", "owner", "image", "gpu", "main",
				fmt.Sprintf("floor-%d-%d", r, i), "v1:fp", params, turn.Add(1))
			return err
		}
	}
	submitNew := func(r int) func(i int) error {
		return func(i int) error {
			nt := newTask(fmt.Sprintf("new-%d-%d", r, i))
			nt.Params = params
			_, err := s.Submit(ctx, nt)
			return err
		}
	}
	// Warm up: every connection has prepared both statements.
	parallel(b, 4*benchClients, insert(-1))
	parallel(b, 4*benchClients, submitNew(-1))

	var floor, submit time.Duration
	const rounds = 4
	per := max(b.N/rounds, benchClients)
	b.ResetTimer()
	for r := range rounds {
		floor += parallel(b, per, insert(r))
		submit += parallel(b, per, submitNew(r))
	}
	b.StopTimer()
	ops := float64(per * rounds)
	b.ReportMetric(ops/floor.Seconds(), "insert/s")
	b.ReportMetric(ops/submit.Seconds(), "submit/s")
	b.ReportMetric(floor.Seconds()/submit.Seconds(), "submit/insert")
	b.ReportMetric(float64(submit.Nanoseconds())/ops, "ns/op")
}

// BenchmarkSubmitExistingKey submits a key that is already held: one
// statement, one round trip, no write.
func BenchmarkSubmitExistingKey(b *testing.B) {
	s, counter := benchStore(b, benchClients)
	ctx := context.Background()
	mustSubmit(b, s, newTask("held"))
	resubmit := func(int) error {
		got, err := s.Submit(ctx, newTask("held"))
		if err == nil && !got.Duplicate {
			err = fmt.Errorf("not a duplicate")
		}
		return err
	}
	parallel(b, 4*benchClients, resubmit) // warm up
	before := counter.Load()
	b.ResetTimer()
	elapsed := parallel(b, b.N, resubmit)
	b.StopTimer()
	b.ReportMetric(float64(counter.Load()-before)/float64(b.N), "round-trips/op")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "submit/s")
	b.ReportMetric(float64(elapsed.Nanoseconds())/float64(b.N), "ns/op")
}

// BenchmarkSubmitStorm64 has 64 clients submit one new key at the same
// instant, once per iteration, and reports their latency percentiles.
func BenchmarkSubmitStorm64(b *testing.B) {
	const clients = 64
	s, counter := benchStore(b, clients)
	ctx := context.Background()
	for i := range 4 { // warm up: prepared statements on every connection
		parallel(b, clients, func(j int) error {
			_, err := s.Submit(ctx, newTask(fmt.Sprintf("warm-%d-%d", i, j)))
			return err
		})
	}
	var lat []time.Duration
	before := counter.Load()
	b.ResetTimer()
	for i := range b.N {
		start := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		ids := map[string]bool{}
		for range clients {
			wg.Go(func() {
				<-start
				t0 := time.Now()
				got, err := s.Submit(ctx, newTask(fmt.Sprintf("storm-%d", i)))
				d := time.Since(t0)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					b.Error(err)
					return
				}
				ids[got.ID] = true
				lat = append(lat, d)
			})
		}
		close(start)
		wg.Wait()
		if len(ids) != 1 {
			b.Fatalf("storm %d made %d tasks", i, len(ids))
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(counter.Load()-before)/float64(b.N*clients), "round-trips/submit")
}

// BenchmarkClaimComplete measures how fast workers drain a backlog with a
// no-op handler: claim, run, record success.
func BenchmarkClaimComplete(b *testing.B) {
	s, _ := benchStore(b, benchClients)
	ctx := context.Background()
	n := max(b.N, 5000)
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint)
		SELECT 'acme', 'o', 'image', 'gpu', 'main', 'bench-' || g, 'f' FROM generate_series(1, $1::int) g`, n); err != nil {
		b.Fatal(err)
	}
	result := json.RawMessage(`{"ok":true}`)
	var done atomic.Int64
	finished := make(chan struct{})
	handler := func(context.Context, Task) Outcome {
		if done.Add(1) == int64(n) {
			close(finished)
		}
		return Succeeded(result)
	}
	b.ResetTimer()
	start := time.Now()
	w := newWorker(b, s, WorkerConfig{Handler: handler, Concurrency: benchConcurrency})
	stop := runWorker(b, w)
	<-finished
	// The last handlers ran; wait for their transitions to land.
	wait.For(b, patience, "countRows(b, s.pool, 'state = 'succeeded'') == n", func() bool { return countRows(b, s.pool, "state = 'succeeded'") == n })
	elapsed := time.Since(start)
	b.StopTimer()
	stop()
	b.ReportMetric(float64(n)/elapsed.Seconds(), "tasks/s")
	b.ReportMetric(float64(elapsed.Nanoseconds())/float64(n), "ns/op")
}

// BenchmarkClaimMixedBacklog measures the claim of one kind's task in two
// databases: one with only that kind's tasks, one where a 100k-task
// backlog of two other kinds came first. Claims alternate between the two
// in rounds, so that the machine's load hits both alike. It reports the
// ratio of their costs (1 is flat) and the buffers each claim reads. Each
// claim runs in a transaction that is rolled back, so every claim meets
// the same table.
func BenchmarkClaimMixedBacklog(b *testing.B) {
	ctx := context.Background()
	type side struct {
		s    *Store
		sql  string
		args pgx.NamedArgs
		took time.Duration
	}
	var sides [2]*side // alone, behind the backlog
	for i := range sides {
		s, _ := benchStore(b, 2)
		if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
			(tenant, owner, kind, runtime, network, idempotency_key, fingerprint)
			SELECT 'acme', 'o', 'image', 'gpu', 'main', 'image-' || g, 'f' FROM generate_series(1, 1000) g`); err != nil {
			b.Fatal(err)
		}
		if i == 1 {
			if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
				(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after)
				SELECT 'acme', 'o', CASE WHEN g % 2 = 0 THEN 'video' ELSE 'audio' END, 'gpu', 'main', 'other-' || g, 'f',
					now() - interval '1 hour'
				FROM generate_series(1, 100000) g`); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := s.pool.Exec(ctx, "VACUUM ANALYZE idemgate_tasks"); err != nil {
			b.Fatal(err)
		}
		w := newWorker(b, s, WorkerConfig{Kinds: []string{"image"}, Handler: func(context.Context, Task) Outcome { return Outcome{} }})
		sql, args := w.claimStatement(1)
		sides[i] = &side{s: s, sql: sql, args: args}
	}
	claim := func(sd *side) time.Duration {
		start := time.Now()
		err := pgx.BeginFunc(ctx, sd.s.pool, func(tx pgx.Tx) error {
			rows, _ := tx.Query(ctx, sd.sql, sd.args)
			got, err := pgx.CollectRows(rows, pgx.RowToStructByName[Task])
			if err == nil && len(got) != 1 {
				err = fmt.Errorf("claimed %d tasks; want 1", len(got))
			}
			if err != nil {
				return err
			}
			return errRollback
		})
		if !errors.Is(err, errRollback) {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	for range 20 { // warm up: plans cached, pages in memory
		claim(sides[0])
		claim(sides[1])
	}
	n := max(b.N, 500)
	b.ResetTimer()
	for i := range n {
		sides[i%2].took += claim(sides[i%2])
		sides[(i+1)%2].took += claim(sides[(i+1)%2])
	}
	b.StopTimer()
	alone, behind := sides[0].took/time.Duration(n), sides[1].took/time.Duration(n)
	b.ReportMetric(float64(alone.Microseconds()), "alone-µs/claim")
	b.ReportMetric(float64(behind.Microseconds()), "behind-100k-µs/claim")
	b.ReportMetric(float64(behind)/float64(alone), "behind/alone")
	b.ReportMetric(float64(claimBuffers(b, sides[0].s, []string{"image"})), "alone-buffers")
	b.ReportMetric(float64(claimBuffers(b, sides[1].s, []string{"image"})), "behind-100k-buffers")
}

// BenchmarkSubmitMany100 compares SubmitMany of batches of 100 new keys
// with its floor: river's shape, one INSERT … SELECT FROM unnest(…) ON
// CONFLICT DO NOTHING RETURNING * of the same rows into a copy of the
// table with the same indexes (no turns, no read-back of held keys, no
// NOTIFY, rows decoded by the same pgx call). Both run with benchClients
// clients, alternating in rounds.
//
//	go test -run XXX -bench SubmitMany100 -benchtime 400x ./pgstore/
func BenchmarkSubmitMany100(b *testing.B) {
	s, _ := benchStore(b, benchClients)
	ctx := context.Background()
	if _, err := s.pool.Exec(ctx, "CREATE TABLE bench_floor (LIKE idemgate_tasks INCLUDING ALL)"); err != nil {
		b.Fatal(err)
	}
	const floorSQL = `INSERT INTO bench_floor AS t
	(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, params)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::jsonb[])
ON CONFLICT (tenant, idempotency_key, runtime, network) DO NOTHING
RETURNING ` + tTaskColumns + `, false AS duplicate`
	const size = 100
	params := []byte(`{"prompt":"a cat in a hat","n":1}`)
	batch := func(prefix string) []NewTask {
		ts := make([]NewTask, size)
		for j := range ts {
			ts[j] = newTask(fmt.Sprintf("%s-%d", prefix, j))
			ts[j].Params = params
		}
		return ts
	}
	insert := func(r int) func(i int) error {
		return func(i int) error {
			cols := make([][]string, 7)
			ps := make([][]byte, size)
			for j, t := range batch(fmt.Sprintf("floor-%d-%d", r, i)) {
				for c, v := range []string{t.Tenant, t.Owner, t.Kind, t.Runtime, t.Network, t.IdempotencyKey, t.Fingerprint} {
					cols[c] = append(cols[c], v)
				}
				ps[j] = t.Params
			}
			rows, _ := s.pool.Query(ctx, floorSQL, cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], cols[6], ps)
			_, err := pgx.CollectRows(rows, pgx.RowToStructByName[Task])
			return err
		}
	}
	submitMany := func(r int) func(i int) error {
		return func(i int) error {
			_, err := s.SubmitMany(ctx, batch(fmt.Sprintf("new-%d-%d", r, i)))
			return err
		}
	}
	parallel(b, 2*benchClients, insert(-1))
	parallel(b, 2*benchClients, submitMany(-1))

	var floor, many time.Duration
	const rounds = 4
	per := max(b.N/rounds, benchClients)
	b.ResetTimer()
	for r := range rounds {
		floor += parallel(b, per, insert(r))
		many += parallel(b, per, submitMany(r))
	}
	b.StopTimer()
	tasks := float64(per * rounds * size)
	b.ReportMetric(tasks/floor.Seconds(), "floor-tasks/s")
	b.ReportMetric(tasks/many.Seconds(), "tasks/s")
	b.ReportMetric(floor.Seconds()/many.Seconds(), "many/floor")
}

// The server's time for BenchmarkSubmitNewKey's two statements, without
// the round trips and client work that dilute it: the median Execution
// Time of EXPLAIN ANALYZE over 400 new keys of Submit's statement (and of
// its v9 trigger, which lists the tenant's line) and of the floor's plain
// INSERT of the same row, alternating. On a busy machine the benchmark's
// ratio tends to this one.
//
//	PGSTORE_MEASURE=1 go test -count=1 -v -run TestMeasureSubmitServerTime ./pgstore/
func TestMeasureSubmitServerTime(t *testing.T) {
	measuring(t)
	ctx := context.Background()
	s, _ := setup(t)
	if _, err := s.pool.Exec(ctx, "CREATE TABLE bench_floor (LIKE idemgate_tasks INCLUDING ALL)"); err != nil {
		t.Fatal(err)
	}
	// execution returns the Execution Time of sql and its triggers' time,
	// in ms.
	execution := func(sql string, args ...any) (total, triggers float64) {
		var plan []map[string]any
		if err := s.pool.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+sql, args...).Scan(&plan); err != nil {
			t.Fatal(err)
		}
		if trs, ok := plan[0]["Triggers"].([]any); ok {
			for _, tr := range trs {
				triggers += tr.(map[string]any)["Time"].(float64)
			}
		}
		return plan[0]["Execution Time"].(float64), triggers
	}
	var submit, trigger, floor []float64
	for i := range 400 {
		nt := newTask(fmt.Sprintf("server-%d", i))
		total, trig := execution(sqlSubmit, pgx.NamedArgs{"tenant": nt.Tenant, "owner": nt.Owner, "kind": nt.Kind,
			"runtime": nt.Runtime, "network": nt.Network, "key": nt.IdempotencyKey, "fingerprint": nt.Fingerprint,
			"params": nil, "trace": "", "run_after": runAfterArg(nt.RunAfter), "priority": 0, "notify": false})
		submit, trigger = append(submit, total), append(trigger, trig)
		total, _ = execution(`INSERT INTO bench_floor (tenant, owner, kind, runtime, network, idempotency_key, fingerprint, turn)
			VALUES ('acme', 'owner', 'image', 'gpu', 'main', $1, 'v1:fp', $2)`, fmt.Sprintf("floor-%d", i), i)
		floor = append(floor, total)
	}
	median := func(x []float64) float64 { slices.Sort(x); return x[len(x)/2] }
	t.Logf("server time, median of 400: Submit %.3f ms (its trigger %.3f), floor INSERT %.3f ms: floor/Submit %.2f (load %s)",
		median(submit), median(trigger), median(floor), median(floor)/median(submit), loadavg())
}
