package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/idemgate/idemgate/internal/pgtrace"
	"github.com/idemgate/idemgate/pgstore"
)

// The queues measured. River runs twice: at its defaults, and tuned the
// way its users tune it for short jobs.
const (
	sysPgstore      = "pgstore"
	sysRiverTuned   = "river-tuned"
	sysRiverDefault = "river-default"
)

// systems lists them in the table's column order.
func systems() []string { return []string{sysPgstore, sysRiverTuned, sysRiverDefault} }

// River's tuning for short jobs: FetchCooldown at its minimum, and a short
// poll so a missed notification costs little.
const (
	tunedFetchCooldown     = river.FetchCooldownMin
	tunedFetchPollInterval = 50 * time.Millisecond
)

// taskKind is the one kind (River: job kind) every task has.
const taskKind = "noop"

// noopArgs are River's job args. Key makes each job unique by args, as the
// idempotency key makes each pgstore task.
type noopArgs struct {
	Key string `json:"key"`
}

func (noopArgs) Kind() string { return taskKind }

// uniqueByArgs is how every River job is inserted: deduplicated by its
// args, which is what pgstore's Submit does by its key.
func uniqueByArgs() *river.InsertOpts {
	return &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

// queue is one system under test on its own database: the inserting side
// (this process) and what the worker processes need to know.
type queue interface {
	// name is one of the sys* constants.
	name() string
	// submit inserts the task for key, or finds it; dup reports a found one.
	submit(ctx context.Context, key string) (dup bool, err error)
	// submitMany inserts the tasks of keys in one call.
	submitMany(ctx context.Context, keys []string) error
	// finished counts the tasks stored, those that completed, and those
	// that took more than one attempt.
	finished(ctx context.Context) (total, done, retried int, err error)
	// reset deletes every task.
	reset(ctx context.Context) error
	// trips counts the round trips of the inserting side so far.
	trips() int64
	close()
}

// openQueue connects to dsn, migrates, and returns the named system.
func openQueue(ctx context.Context, name, dsn string, conns int) (queue, error) {
	pool, rt, err := newPool(ctx, dsn, conns)
	if err != nil {
		return nil, err
	}
	var q queue
	switch name {
	case sysPgstore:
		q, err = openPgstore(ctx, pool, rt)
	case sysRiverTuned, sysRiverDefault:
		q, err = openRiver(ctx, name, pool, rt)
	default:
		err = fmt.Errorf("unknown system %q", name)
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	return q, nil
}

// newPool opens a pool of conns connections, all of them before it returns,
// so that no measurement pays for a handshake, and counts its round trips.
func newPool(ctx context.Context, dsn string, conns int) (*pgxpool.Pool, *pgtrace.RoundTrips, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("parse dsn: %w", err)
	}
	cfg.MaxConns = int32(conns)
	cfg.MinConns = int32(conns)
	rt := &pgtrace.RoundTrips{}
	cfg.ConnConfig.Tracer = rt
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	held := make([]*pgxpool.Conn, 0, conns)
	for range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			pool.Close()
			return nil, nil, fmt.Errorf("connect: %w", err)
		}
		held = append(held, c)
	}
	for _, c := range held {
		c.Release()
	}
	return pool, rt, nil
}

// pgstoreQueue submits with pgstore.Submit.
type pgstoreQueue struct {
	pool  *pgxpool.Pool
	rt    *pgtrace.RoundTrips
	store *pgstore.Store
}

func openPgstore(ctx context.Context, pool *pgxpool.Pool, rt *pgtrace.RoundTrips) (*pgstoreQueue, error) {
	s, err := pgstore.New(ctx, pool)
	if err != nil {
		return nil, err
	}
	if err := s.Migrate(ctx); err != nil {
		return nil, err
	}
	return &pgstoreQueue{pool: pool, rt: rt, store: s}, nil
}

func (q *pgstoreQueue) name() string { return sysPgstore }

func newTask(key string) pgstore.NewTask {
	params, _ := json.Marshal(noopArgs{Key: key})
	return pgstore.NewTask{Tenant: "bench", Owner: "bench", Kind: taskKind,
		IdempotencyKey: key, Fingerprint: "v1:bench", Params: params}
}

func (q *pgstoreQueue) submit(ctx context.Context, key string) (bool, error) {
	t, err := q.store.Submit(ctx, newTask(key))
	return t.Duplicate, err
}

// batchMode says how the batch row submits to pgstore: with SubmitMany
// when the package has it, else with Submit in a loop inside one
// transaction (SubmitTx).
func batchMode() string {
	v := reflect.ValueOf((*pgstore.Store)(nil))
	if _, ok := submitManyOf(v); ok {
		return "SubmitMany"
	}
	if v.MethodByName("SubmitMany").IsValid() {
		return "SubmitTx loop in one transaction (SubmitMany has an unexpected signature)"
	}
	return "SubmitTx loop in one transaction (no SubmitMany yet)"
}

// submitManyOf returns v's SubmitMany method if it has the shape pgstore's
// will have: func(context.Context, []pgstore.NewTask) ([]R, error), where
// R is a struct with an Err error field. It is found through reflection so
// that this module builds before and after pgstore gains it.
func submitManyOf(v reflect.Value) (reflect.Value, bool) {
	m := v.MethodByName("SubmitMany")
	if !m.IsValid() {
		return reflect.Value{}, false
	}
	t := m.Type()
	errType := reflect.TypeFor[error]()
	if t.NumIn() != 2 || t.In(0) != reflect.TypeFor[context.Context]() || t.In(1) != reflect.TypeFor[[]pgstore.NewTask]() ||
		t.NumOut() != 2 || t.Out(1) != errType || t.Out(0).Kind() != reflect.Slice || t.Out(0).Elem().Kind() != reflect.Struct {
		return reflect.Value{}, false
	}
	if f, ok := t.Out(0).Elem().FieldByName("Err"); !ok || f.Type != errType {
		return reflect.Value{}, false
	}
	return m, true
}

// callSubmitMany calls a method found by submitManyOf and checks that it
// returned one result per task and no error for any of them.
func callSubmitMany(ctx context.Context, m reflect.Value, tasks []pgstore.NewTask) error {
	out := m.Call([]reflect.Value{reflect.ValueOf(ctx), reflect.ValueOf(tasks)})
	if err, _ := out[1].Interface().(error); err != nil {
		return err
	}
	res := out[0]
	if res.Len() != len(tasks) {
		return fmt.Errorf("SubmitMany returned %d results for %d tasks", res.Len(), len(tasks))
	}
	for i := range res.Len() {
		if err, _ := res.Index(i).FieldByName("Err").Interface().(error); err != nil {
			return fmt.Errorf("SubmitMany item %d: %w", i, err)
		}
	}
	return nil
}

func (q *pgstoreQueue) submitMany(ctx context.Context, keys []string) error {
	tasks := make([]pgstore.NewTask, len(keys))
	for i, k := range keys {
		tasks[i] = newTask(k)
	}
	if m, ok := submitManyOf(reflect.ValueOf(q.store)); ok {
		return callSubmitMany(ctx, m, tasks)
	}
	return pgx.BeginFunc(ctx, q.pool, func(tx pgx.Tx) error {
		for _, t := range tasks {
			if _, err := q.store.SubmitTx(ctx, tx, t); err != nil {
				return err
			}
		}
		return nil
	})
}

func (q *pgstoreQueue) finished(ctx context.Context) (total, done, retried int, err error) {
	err = q.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state = 'succeeded'),
	count(*) FILTER (WHERE attempt > 1) FROM idemgate_tasks`).Scan(&total, &done, &retried)
	return total, done, retried, err
}

func (q *pgstoreQueue) reset(ctx context.Context) error {
	_, err := q.pool.Exec(ctx, "TRUNCATE idemgate_tasks")
	return err
}

func (q *pgstoreQueue) trips() int64 { return q.rt.Load() }

func (q *pgstoreQueue) close() { q.pool.Close() }

// riverQueue inserts with an insert-only River client configured like the
// workers of its variant (the insert notification is throttled by
// FetchCooldown).
type riverQueue struct {
	sys    string
	pool   *pgxpool.Pool
	rt     *pgtrace.RoundTrips
	client *river.Client[pgx.Tx]
}

// riverConfig is the client configuration of variant sys; workers is nil
// for an insert-only client.
func riverConfig(sys string, workers *river.Workers, slots int) *river.Config {
	cfg := &river.Config{
		Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Workers: workers,
	}
	if workers != nil {
		cfg.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: slots}}
	}
	if sys == sysRiverTuned {
		cfg.FetchCooldown = tunedFetchCooldown
		cfg.FetchPollInterval = tunedFetchPollInterval
	}
	return cfg
}

func openRiver(ctx context.Context, sys string, pool *pgxpool.Pool, rt *pgtrace.RoundTrips) (*riverQueue, error) {
	driver := riverpgxv5.New(pool)
	m, err := rivermigrate.New(driver, nil)
	if err != nil {
		return nil, err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return nil, fmt.Errorf("river migrate: %w", err)
	}
	c, err := river.NewClient(driver, riverConfig(sys, nil, 0))
	if err != nil {
		return nil, err
	}
	return &riverQueue{sys: sys, pool: pool, rt: rt, client: c}, nil
}

func (q *riverQueue) name() string { return q.sys }

func (q *riverQueue) submit(ctx context.Context, key string) (bool, error) {
	res, err := q.client.Insert(ctx, noopArgs{Key: key}, uniqueByArgs())
	if err != nil {
		return false, err
	}
	return res.UniqueSkippedAsDuplicate, nil
}

func (q *riverQueue) submitMany(ctx context.Context, keys []string) error {
	params := make([]river.InsertManyParams, len(keys))
	for i, k := range keys {
		params[i] = river.InsertManyParams{Args: noopArgs{Key: k}, InsertOpts: uniqueByArgs()}
	}
	res, err := q.client.InsertMany(ctx, params)
	if err != nil {
		return err
	}
	if len(res) != len(keys) {
		return fmt.Errorf("InsertMany returned %d results for %d jobs", len(res), len(keys))
	}
	return nil
}

func (q *riverQueue) finished(ctx context.Context) (total, done, retried int, err error) {
	err = q.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state = 'completed'),
	count(*) FILTER (WHERE attempt > 1) FROM river_job`).Scan(&total, &done, &retried)
	return total, done, retried, err
}

func (q *riverQueue) reset(ctx context.Context) error {
	_, err := q.pool.Exec(ctx, "TRUNCATE river_job")
	return err
}

func (q *riverQueue) trips() int64 { return q.rt.Load() }

func (q *riverQueue) close() { q.pool.Close() }
