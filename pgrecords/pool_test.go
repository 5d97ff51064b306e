package pgrecords_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/storetest"
)

// poolWith returns a pool on dsn whose config edit changed.
func poolWith(t *testing.T, dsn string, edit func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	edit(cfg)
	pool, err := pgxpool.NewWithConfig(testCtx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// allExecModes are pgx's exec modes: the default (cache statement),
// the describe modes, and exec and the simple protocol, which prepare
// nothing and get the claim's columns in text format.
var allExecModes = []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
	pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}

// storeInMode is a pool on dsn whose statements go in exec mode, and a
// Store on it.
func storeInMode(t *testing.T, dsn string, mode pgx.QueryExecMode) (*pgxpool.Pool, *pgrecords.Store) {
	t.Helper()
	p := poolWith(t, dsn, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })
	s, err := pgrecords.New(testCtx(t), p)
	if err != nil {
		t.Fatal(err)
	}
	return p, s
}

// TestQueryExecModes: users configure pgx pools in other exec modes
// than the default (describe modes for transaction pooling). The whole
// conformance suite holds in each; TestQueryExecModesWithoutPrepare runs
// the modes that prepare nothing.
func TestQueryExecModes(t *testing.T) {
	t.Parallel()
	runExecModes(t, pgx.QueryExecModeDescribeExec, pgx.QueryExecModeCacheDescribe)
}

// runExecModes runs the conformance suite on stores whose pools use each
// of modes.
func runExecModes(t *testing.T, modes ...pgx.QueryExecMode) {
	dsn := testenv.PostgresDSN(t)
	newStore(t, newPool(t, dsn)) // migrate once
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			var stores []*pgrecords.Store
			for range 2 {
				pool := poolWith(t, dsn, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })
				s, err := pgrecords.New(testCtx(t), pool)
				if err != nil {
					t.Fatal(err)
				}
				stores = append(stores, s)
			}
			storetest.Run(t, func(t *testing.T) storetest.Harness {
				return storetest.Harness{Store: stores[0], Other: stores[1], Advance: time.Sleep, Lease: realLease}
			})
		})
	}
}

// TestReadOnlyDatabase: a pool whose sessions default to read-only
// transactions (a replica, default_transaction_read_only) cannot claim: a
// clear error, not a false answer; a replay of an existing record still
// reads.
func TestReadOnlyDatabase(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	rw := newStore(t, newPool(t, dsn))
	k := key()
	req := request(time.Hour)
	mustClaim(t, rw, k, req, idemgate.Claimed)
	if err := rw.Complete(testCtx(t), k, req.Token, sample(), time.Hour); err != nil {
		t.Fatal(err)
	}
	ro, err := pgrecords.New(testCtx(t), poolWith(t, dsn, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	}))
	if err != nil {
		t.Fatal(err)
	}
	var pgErr *pgconn.PgError
	res, err := ro.Claim(testCtx(t), key(), request(time.Hour))
	if !errors.As(err, &pgErr) || pgErr.Code != "25006" {
		t.Errorf("Claim on a read-only session = %+v, %v; want SQLSTATE 25006", res, err)
	}
	r := req
	r.Token = token()
	mustClaim(t, ro, k, r, idemgate.Finished)
	if err := ro.Migrate(testCtx(t)); err != nil {
		t.Logf("Migrate on a read-only session (already migrated): %v", err)
	}
	if _, err := ro.Sweep(testCtx(t)); !errors.As(err, &pgErr) {
		t.Errorf("Sweep on a read-only session = %v, want a Postgres error", err)
	}
}

// TestTerminatedConnections: pg_terminate_backend of the pool's
// connections between calls makes at most the call that hit a dead
// connection fail; the record and its fencing survive, and the pool
// recovers.
func TestTerminatedConnections(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	admin := newPool(t, dsn)
	pool := newPool(t, dsn)
	s := newStore(t, pool)
	kill := func() {
		t.Helper()
		if _, err := admin.Exec(testCtx(t), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`); err != nil {
			t.Fatal(err)
		}
	}
	// retry is what a caller (the middleware's retry by the client) does;
	// each dead connection fails one call, and the pool holds at most
	// MaxConns of them.
	retry := func(f func() error) error {
		var err error
		for range int(pool.Config().MaxConns) + 1 {
			if err = f(); err == nil || errors.Is(err, idemgate.ErrLeaseLost) {
				return err
			}
		}
		return err
	}
	k := key()
	req := request(time.Hour)
	kill()
	var res idemgate.ClaimResult
	if err := retry(func() (err error) { res, err = s.Claim(testCtx(t), k, req); return err }); err != nil || res.Status != idemgate.Claimed {
		t.Fatalf("Claim after kill: %+v, %v", res, err)
	}
	kill()
	if err := retry(func() error { return s.Extend(testCtx(t), k, req.Token, time.Hour) }); err != nil {
		t.Fatalf("Extend after kill: %v", err)
	}
	kill()
	if err := retry(func() error { return s.Complete(testCtx(t), k, req.Token, sample(), time.Hour) }); err != nil {
		t.Fatalf("Complete after kill: %v", err)
	}
	kill()
	r := req
	r.Token = token()
	if err := retry(func() (err error) { res, err = s.Claim(testCtx(t), k, r); return err }); err != nil || res.Status != idemgate.Finished {
		t.Fatalf("replay after kill: %+v, %v", res, err)
	}
}

// TestSchemas: two stores on one database whose pools have
// different search_paths keep separate tables (Migrate from many
// goroutines at once creates each once) and never see each other's
// records.
func TestSchemas(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	admin := newPool(t, dsn)
	if _, err := admin.Exec(testCtx(t), `CREATE SCHEMA tenant_a; CREATE SCHEMA tenant_b`); err != nil {
		t.Fatal(err)
	}
	var stores []*pgrecords.Store
	for _, schema := range []string{"tenant_a", "tenant_b", "public"} {
		pool := poolWith(t, dsn, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["search_path"] = schema })
		s, err := pgrecords.New(testCtx(t), pool)
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := stores[i%3].Migrate(testCtx(t)); err != nil {
				t.Errorf("Migrate: %v", err)
			}
		}()
	}
	wg.Wait()
	var tables int
	if err := admin.QueryRow(testCtx(t), `SELECT count(*) FROM pg_tables WHERE tablename = 'idemgate_records'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 3 {
		t.Fatalf("%d records tables, want 3", tables)
	}
	k := key()
	req := request(time.Hour)
	mustClaim(t, stores[0], k, req, idemgate.Claimed)
	if err := stores[0].Complete(testCtx(t), k, req.Token, sample(), time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, s := range stores[1:] {
		r := req
		r.Token = token()
		mustClaim(t, s, k, r, idemgate.Claimed)
	}
}

// TestIsolationDefault: a pool whose sessions default to REPEATABLE
// READ or SERIALIZABLE (default_transaction_isolation, set by a framework
// or a role) still answers concurrent claims of one key: one winner, the
// others running, no error (an error is a 503 to the client).
func TestIsolationDefault(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	newStore(t, newPool(t, dsn))
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			var stores []*pgrecords.Store
			for range 2 {
				s, err := pgrecords.New(testCtx(t), poolWith(t, dsn, func(c *pgxpool.Config) {
					c.ConnConfig.RuntimeParams["default_transaction_isolation"] = level
				}))
				if err != nil {
					t.Fatal(err)
				}
				stores = append(stores, s)
			}
			var errs, winners int
			for round := range 20 {
				k := key()
				var (
					wg sync.WaitGroup
					mu sync.Mutex
					w  int
				)
				for i := range 16 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						res, err := stores[(i+round)%2].Claim(testCtx(t), k, request(time.Hour))
						mu.Lock()
						defer mu.Unlock()
						if err != nil {
							if errs == 0 {
								t.Errorf("Claim under %s: %v", level, err)
							}
							errs++
							return
						}
						if res.Status == idemgate.Claimed {
							w++
						}
					}()
				}
				wg.Wait()
				if w > 1 {
					t.Errorf("round %d: %d winners", round, w)
				}
				winners += w
			}
			if errs > 0 {
				t.Errorf("%d of 320 concurrent claims failed under %s", errs, level)
			}
		})
	}
}

// TestQueryExecModesWithoutPrepare: a pool in the simple protocol
// or exec mode (what PgBouncer users set, often in the URL:
// ?default_query_exec_mode=exec) must run the store like any other.
func TestQueryExecModesWithoutPrepare(t *testing.T) {
	t.Parallel()
	runExecModes(t, pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec)
}
