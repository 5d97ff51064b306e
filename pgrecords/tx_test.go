package pgrecords_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/pgtrace"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
)

// atomicRoute serves POST / Atomic on s with handler h.
func atomicRoute(t *testing.T, s idemgate.Store, h echo.HandlerFunc, configure func(*middleware.Config)) *echo.Echo {
	t.Helper()
	cfg := middleware.Config{Store: s, Atomic: true,
		Scope: func(echo.Context) (string, string, error) { return "acme", "alice", nil }}
	if configure != nil {
		configure(&cfg)
	}
	mw, err := cfg.ToMiddleware()
	if err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	e.POST("/", h, mw)
	return e
}

func atomicSend(e *echo.Echo, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{}`))
	r.Header.Set("Content-Type", "application/json")
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	e.ServeHTTP(w, r)
	return w
}

// TestTxClosedAfterRequest: a handler that keeps its transaction
// past the request (a goroutine) gets pgx.ErrTxClosed from it: the
// connection went back to the pool and serves other requests, which a
// stray statement must not run in.
func TestTxClosedAfterRequest(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	for _, first := range []bool{true, false} {
		kept, keptSavepoint := make(chan pgx.Tx, 1), make(chan pgx.Tx, 1)
		e := echo.New()
		e.POST("/", func(c echo.Context) error {
			tx := pgrecords.Tx(c)
			if first {
				if _, err := tx.Exec(c.Request().Context(), `INSERT INTO ledger (key, node) VALUES ('kept', 'in time')`); err != nil {
					return err
				}
				sp, err := tx.Begin(c.Request().Context())
				if err != nil {
					return err
				}
				if err := sp.Commit(c.Request().Context()); err != nil {
					return err
				}
				keptSavepoint <- sp
			}
			kept <- tx
			return c.NoContent(http.StatusCreated)
		}, middleware.New(middleware.Config{Store: s, Atomic: true,
			Scope: func(echo.Context) (string, string, error) { return "acme", "alice", nil }}))
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("x"))
		r.Header.Set("Idempotency-Key", fmt.Sprint("kept-", first))
		w := httptest.NewRecorder()
		e.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			t.Fatalf("request = %d %s", w.Code, w.Body)
		}
		tx := <-kept
		if _, err := tx.Exec(testCtx(t), `INSERT INTO ledger (key, node) VALUES ('kept', 'late')`); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("Exec after the request (statement before: %v) = %v, want pgx.ErrTxClosed", first, err)
		}
		if err := tx.QueryRow(testCtx(t), `SELECT 1`).Scan(new(int)); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("QueryRow after the request = %v, want pgx.ErrTxClosed", err)
		}
		if err := tx.SendBatch(testCtx(t), &pgx.Batch{}).Close(); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("SendBatch after the request = %v, want pgx.ErrTxClosed", err)
		}
		for _, m := range []func(pgx.Tx) error{
			func(tx pgx.Tx) error { _, err := tx.Begin(testCtx(t)); return err },
			func(tx pgx.Tx) error { _, err := tx.Prepare(testCtx(t), "late", `SELECT 1`); return err },
			func(tx pgx.Tx) error {
				_, err := tx.CopyFrom(testCtx(t), pgx.Identifier{"ledger"}, []string{"key", "node"}, pgx.CopyFromRows([][]any{{"kept", "late"}}))
				return err
			},
		} {
			if err := m(tx); !errors.Is(err, pgx.ErrTxClosed) {
				t.Errorf("a method after the request = %v, want pgx.ErrTxClosed", err)
			}
		}
		if tx.Conn() != nil {
			t.Errorf("Conn after the request is not nil")
		}
		if first {
			sp := <-keptSavepoint
			if _, err := sp.Exec(testCtx(t), `INSERT INTO ledger (key, node) VALUES ('kept', 'late')`); !errors.Is(err, pgx.ErrTxClosed) {
				t.Errorf("Exec on a savepoint after the request = %v, want pgx.ErrTxClosed", err)
			}
		}
	}
	var late int
	if err := pool.QueryRow(testCtx(t), `SELECT count(*) FROM ledger WHERE node = 'late'`).Scan(&late); err != nil || late != 0 {
		t.Errorf("late rows = %d, %v; want 0", late, err)
	}
}

// TestTxLateUseLeavesThePoolClean: a transaction used after its request
// (the handler had sent nothing) fails, and sends nothing, not even a
// BEGIN: the connection it would have used is back in the pool, and the
// next claim on it must not run inside a stray transaction that is later
// rolled back (the key would be claimed twice).
func TestTxLateUseLeavesThePoolClean(t *testing.T) {
	t.Parallel()
	pool, _ := atomicDB(t)
	one := poolWith(t, pool.Config().ConnString(), func(c *pgxpool.Config) { c.MaxConns = 1 })
	s1, err := pgrecords.New(testCtx(t), one)
	if err != nil {
		t.Fatal(err)
	}
	other := newStore(t, newPool(t, pool.Config().ConnString()))
	var saved pgx.Tx
	e := atomicRoute(t, s1, func(c echo.Context) error {
		saved = pgrecords.Tx(c)
		return c.String(http.StatusCreated, "ok")
	}, nil)
	if rec := atomicSend(e, "swallow-first"); rec.Code != http.StatusCreated {
		t.Fatalf("request = %d %s", rec.Code, rec.Body)
	}
	if _, err := saved.Exec(context.Background(), `SELECT 1`); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Exec after the request = %v, want pgx.ErrTxClosed", err)
	}
	if saved.Conn() != nil {
		t.Errorf("Conn after the request is not nil")
	}
	k := key()
	mustClaim(t, s1, k, request(time.Minute), idemgate.Claimed)
	res, err := other.Claim(testCtx(t), k, request(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if res.Status == idemgate.Claimed {
		t.Errorf("a second claim of a key claimed a moment before (with a minute's lease) was Claimed too")
	}
}

// TestTxRaceWithCommit: a goroutine of the handler's keeps writing through
// the transaction while the middleware commits. Each of its statements
// runs before the commit, in the transaction, or fails with
// pgx.ErrTxClosed; none runs on the connection after it went back to the
// pool.
func TestTxRaceWithCommit(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	var ok atomic.Int64
	stopped := make(chan error, 1)
	e := atomicRoute(t, s, func(c echo.Context) error {
		tx := pgrecords.Tx(c)
		if _, err := tx.Exec(c.Request().Context(), `INSERT INTO ledger (key, node) VALUES ('race', 'handler')`); err != nil {
			return err
		}
		ok.Add(1)
		started := make(chan struct{})
		go func() {
			close(started)
			for {
				if _, err := tx.Exec(context.Background(), `INSERT INTO ledger (key, node) VALUES ('race', 'goroutine')`); err != nil {
					stopped <- err
					return
				}
				ok.Add(1)
			}
		}()
		<-started
		return c.String(http.StatusCreated, "ok")
	}, nil)
	if rec := atomicSend(e, "race"); rec.Code != http.StatusCreated {
		t.Fatalf("request = %d %s", rec.Code, rec.Body)
	}
	if err := <-stopped; !errors.Is(err, pgx.ErrTxClosed) {
		t.Errorf("the goroutine stopped with %v, want pgx.ErrTxClosed", err)
	}
	if got := ledgerRows(t, pool, "race"); int64(got) != ok.Load() {
		t.Errorf("ledger rows = %d, want the %d statements that succeeded (all in the transaction)", got, ok.Load())
	}
}

// TestTxHandlerCommitStatement: a handler that ends its transaction with
// a COMMIT (or ROLLBACK) statement of its own has broken the Atomic
// contract: its writes committed apart from the record. The middleware
// notices at the commit or the rollback: it answers 500, stores nothing
// (the retry runs), releases the claim (event released, reason
// tx_aborted) and reports no store error; the handler's statements after
// its COMMIT fail instead of running in autocommit.
func TestTxHandlerCommitStatement(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	var mu sync.Mutex
	var events []idemgate.Event
	var after error
	e := atomicRoute(t, s, func(c echo.Context) error {
		tx := pgrecords.Tx(c)
		ctx := c.Request().Context()
		key := c.Request().Header.Get("Idempotency-Key")
		if _, err := tx.Exec(ctx, `INSERT INTO ledger (key, node) VALUES ($1, 'h')`, key); err != nil {
			return err
		}
		end := `COMMIT`
		if strings.Contains(key, "rollback") {
			end = `ROLLBACK`
		}
		if _, err := tx.Exec(ctx, end); err != nil {
			return err
		}
		_, after = tx.Exec(ctx, `INSERT INTO ledger (key, node) VALUES ($1, 'after')`, key)
		if strings.Contains(key, "500") {
			return c.String(http.StatusInternalServerError, "failed after the write")
		}
		return c.String(http.StatusCreated, "ok")
	}, func(c *middleware.Config) {
		c.OnEvent = func(_ context.Context, ev idemgate.Event) { mu.Lock(); events = append(events, ev); mu.Unlock() }
	})
	for _, k := range []string{"commit-201", "commit-500", "rollback-201"} {
		t.Run(k, func(t *testing.T) {
			mu.Lock()
			events = nil
			mu.Unlock()
			for run := range 2 {
				rec := atomicSend(e, k)
				if rec.Code != http.StatusInternalServerError || rec.Header().Get("Idempotent-Replayed") != "" {
					t.Errorf("run %d = %d replayed=%q %s, want 500 and no replay", run, rec.Code, rec.Header().Get("Idempotent-Replayed"), rec.Body)
				}
				if !errors.Is(after, idemgate.ErrTxAborted) {
					t.Errorf("run %d: a statement after the handler's own %s = %v, want idemgate.ErrTxAborted", run, k, after)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			released := 0
			for _, ev := range events {
				switch {
				case ev.Type == idemgate.EventStoreError:
					t.Errorf("store_error event %s: %v", ev.Reason, ev.Err)
				case ev.Type == idemgate.EventReleased && ev.Reason == "tx_aborted":
					released++
				}
			}
			if released != 2 {
				t.Errorf("released tx_aborted events = %d, want 2; events %v", released, events)
			}
			want := 2 // the handler's own COMMIT committed its first row, each run
			if strings.HasPrefix(k, "rollback") {
				want = 0
			}
			if got := ledgerRows(t, pool, k); got != want {
				t.Errorf("ledger rows = %d, want %d", got, want)
			}
		})
	}
}

// TestTxAbortedIsHandlerFault: a statement of the handler's fails (the
// transaction is aborted, 25P02 from then on); the handler ignores it and
// answers 201. That is the handler's fault, not the store's: the client
// gets 500, the claim is released (reason tx_aborted) and the retry runs;
// no store_error.
func TestTxAbortedIsHandlerFault(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	var events []idemgate.Event
	fail := true
	e := atomicRoute(t, s, func(c echo.Context) error {
		tx := pgrecords.Tx(c)
		ctx := c.Request().Context()
		if _, err := tx.Exec(ctx, `INSERT INTO ledger (key, node) VALUES ('aborted', 'h')`); err != nil {
			return err
		}
		if fail {
			_, _ = tx.Exec(ctx, `SELECT 1/0`) // ignored
		}
		return c.String(http.StatusCreated, "ok")
	}, func(c *middleware.Config) {
		c.OnEvent = func(_ context.Context, ev idemgate.Event) { events = append(events, ev) }
	})
	if first := atomicSend(e, "aborted"); first.Code != http.StatusInternalServerError {
		t.Errorf("a handler whose transaction was aborted got %d %s to its client, want 500", first.Code, first.Body)
	}
	released := false
	for _, ev := range events {
		switch {
		case ev.Type == idemgate.EventStoreError:
			t.Errorf("store_error event %s: %v", ev.Reason, ev.Err)
		case ev.Type == idemgate.EventReleased:
			released = ev.Reason == "tx_aborted"
		}
	}
	if !released {
		t.Errorf("events %v, want released tx_aborted", events)
	}
	fail = false
	if retry := atomicSend(e, "aborted"); retry.Code != http.StatusCreated || retry.Header().Get("Idempotent-Replayed") == "true" {
		t.Errorf("retry = %d replayed=%q, want a run", retry.Code, retry.Header().Get("Idempotent-Replayed"))
	}
	if got := ledgerRows(t, pool, "aborted"); got != 1 {
		t.Errorf("ledger rows = %d, want 1", got)
	}
}

// TestTxNestedSavepoints: pgx.BeginFunc on the request's transaction
// (savepoints, two deep); the inner one fails and is rolled back, the
// outer one commits, and the request commits the rest.
func TestTxNestedSavepoints(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	e := atomicRoute(t, s, func(c echo.Context) error {
		ctx := c.Request().Context()
		ins := `INSERT INTO ledger (key, node) VALUES ('nested', $1)`
		err := pgx.BeginFunc(ctx, pgrecords.Tx(c), func(outer pgx.Tx) error {
			if _, err := outer.Exec(ctx, ins, "outer"); err != nil {
				return err
			}
			inner := pgx.BeginFunc(ctx, outer, func(in pgx.Tx) error {
				if _, err := in.Exec(ctx, ins, "inner"); err != nil {
					return err
				}
				_, err := in.Exec(ctx, `SELECT 1/0`)
				return err
			})
			if inner == nil {
				return errors.New("inner savepoint did not fail")
			}
			return nil
		})
		if err != nil {
			return err
		}
		return c.String(http.StatusCreated, "ok")
	}, nil)
	if rec := atomicSend(e, "nested"); rec.Code != http.StatusCreated {
		t.Fatalf("request = %d %s", rec.Code, rec.Body)
	}
	if got := ledgerNodes(t, pool, "nested"); got != "outer" {
		t.Errorf("committed %q, want %q", got, "outer")
	}
}

// TestTxTerminatedBeforeCommit: the handler's backend is killed
// (pg_terminate_backend) after its write, before the commit: the client
// gets no 2xx, nothing committed, and the retry runs once.
func TestTxTerminatedBeforeCommit(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	kill := true
	e := atomicRoute(t, s, func(c echo.Context) error {
		tx := pgrecords.Tx(c)
		ctx := c.Request().Context()
		var pid int32
		if err := tx.QueryRow(ctx, `INSERT INTO ledger (key, node) VALUES ('terminated', 'h') RETURNING pg_backend_pid()`).Scan(&pid); err != nil {
			return err
		}
		if kill {
			if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
				return err
			}
			time.Sleep(100 * time.Millisecond)
		}
		return c.String(http.StatusCreated, "ok")
	}, nil)
	first := atomicSend(e, "terminated")
	if first.Code/100 == 2 {
		t.Errorf("first = %d, want no 2xx", first.Code)
	}
	kill = false
	if retry := atomicSend(e, "terminated"); retry.Code != http.StatusCreated || retry.Header().Get("Idempotent-Replayed") == "true" {
		t.Errorf("retry = %d replayed=%q %s", retry.Code, retry.Header().Get("Idempotent-Replayed"), retry.Body)
	}
	if got := ledgerRows(t, pool, "terminated"); got != 1 {
		t.Errorf("ledger rows = %d, want 1", got)
	}
}

// TestTxSavepoints: savepoints of the request's transaction, nested,
// rolled back, failed and around large objects, commit what pgx's would,
// and cost the round trips they cost in pgx: a savepoint around the
// handler's one write (what pgstore.SubmitTx does) makes a miss 6 (claim;
// BEGIN and the setup; SAVEPOINT; the write; RELEASE; the completion with
// COMMIT), where the write alone makes it 3.
func TestTxSavepoints(t *testing.T) {
	t.Parallel()
	var trips pgtrace.RoundTrips
	pool := poolWith(t, testenv.PostgresDSN(t), func(c *pgxpool.Config) { c.ConnConfig.Tracer = &trips })
	s := newStore(t, pool)
	if _, err := pool.Exec(testCtx(t), ledgerDDL); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name  string
		given func(ctx context.Context, tx pgx.Tx, key string) error
		want  string // the nodes committed, in order
		trips int64  // round trips of the request
	}{
		{
			name: "write in a savepoint", want: "in", trips: 6,
			given: func(ctx context.Context, tx pgx.Tx, key string) error {
				return pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error { return ledgerInsert(ctx, sp, key, "in") })
			},
		},
		{
			name: "empty savepoint, then a write", want: "after", trips: 6,
			given: func(ctx context.Context, tx pgx.Tx, key string) error {
				if err := pgx.BeginFunc(ctx, tx, func(pgx.Tx) error { return nil }); err != nil {
					return err
				}
				return ledgerInsert(ctx, tx, key, "after")
			},
		},
		{
			name: "rolled back after its write", want: "after", trips: 7,
			given: func(ctx context.Context, tx pgx.Tx, key string) error {
				sp, err := tx.Begin(ctx)
				if err != nil {
					return err
				}
				if err := ledgerInsert(ctx, sp, key, "rolled-back"); err != nil {
					return err
				}
				if err := sp.Rollback(ctx); err != nil {
					return err
				}
				return ledgerInsert(ctx, tx, key, "after")
			},
		},
		{
			name: "released inner, outer rolled back", want: "after", trips: 10,
			given: func(ctx context.Context, tx pgx.Tx, key string) error {
				outer, err := tx.Begin(ctx)
				if err != nil {
					return err
				}
				if err := ledgerInsert(ctx, outer, key, "outer"); err != nil {
					return err
				}
				if err := pgx.BeginFunc(ctx, outer, func(in pgx.Tx) error { return ledgerInsert(ctx, in, key, "inner") }); err != nil {
					return err
				}
				if err := outer.Rollback(ctx); err != nil {
					return err
				}
				return ledgerInsert(ctx, tx, key, "after")
			},
		},
		{
			name: "failed statement rolled back, outer released", want: "outer,after", trips: 10,
			given: func(ctx context.Context, tx pgx.Tx, key string) error {
				err := pgx.BeginFunc(ctx, tx, func(outer pgx.Tx) error {
					if err := ledgerInsert(ctx, outer, key, "outer"); err != nil {
						return err
					}
					if pgx.BeginFunc(ctx, outer, func(in pgx.Tx) error {
						_, err := in.Exec(ctx, `SELECT 1/0`)
						return err
					}) == nil {
						return errors.New("1/0 did not fail")
					}
					return nil
				})
				if err != nil {
					return err
				}
				return ledgerInsert(ctx, tx, key, "after")
			},
		},
		{
			// Large objects' statements bypass the queue: the savepoint
			// must be on the server before them.
			name: "large object in a savepoint rolled back", want: "after", trips: 7,
			given: func(ctx context.Context, tx pgx.Tx, key string) error {
				lo := tx.LargeObjects()
				sp, err := tx.Begin(ctx)
				if err != nil {
					return err
				}
				oid, err := lo.Create(ctx, 0)
				if err != nil {
					return err
				}
				if err := sp.Rollback(ctx); err != nil {
					return err
				}
				_ = oid // gone with the savepoint (checked below)
				return ledgerInsert(ctx, tx, key, "after")
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			key := "savepoints-" + strings.ReplaceAll(tt.name, " ", "-")
			e := atomicRoute(t, s, func(c echo.Context) error {
				if err := tt.given(c.Request().Context(), pgrecords.Tx(c), c.Request().Header.Get("Idempotency-Key")); err != nil {
					return err
				}
				return c.String(http.StatusCreated, "ok")
			}, nil)
			atomicSend(e, "warm-"+key) // prepares the statements on a connection
			before := trips.Load()
			if rec := atomicSend(e, key); rec.Code != http.StatusCreated {
				t.Fatalf("request = %d %s", rec.Code, rec.Body)
			}
			if got := trips.Load() - before; got != tt.trips {
				t.Errorf("round trips = %d, want %d", got, tt.trips)
			}
			if got := ledgerNodes(t, pool, key); got != tt.want {
				t.Errorf("committed %q, want %q", got, tt.want)
			}
		})
	}
	var los int
	if err := pool.QueryRow(testCtx(t), `SELECT count(*) FROM pg_largeobject_metadata`).Scan(&los); err != nil || los != 0 {
		t.Errorf("large objects = %d, %v; want 0 (rolled back with their savepoint)", los, err)
	}
}

// firstStatementFailures are handler statements that fail, as the
// handler's first, before anything of their batch runs in the modes that
// prepare (pgx prepares a batch's new statements and encodes all their
// arguments before it runs the first), so BEGIN and the setup, sent in
// front of the handler's first statement, do not run either. aborts are
// the exec modes in which the statement does run, after BEGIN in the same
// round trip, and the server's error aborts the transaction (exec sends
// it unprepared; the simple protocol sends the arguments as literals, and
// parses the whole query string before running any of it).
var firstStatementFailures = []struct {
	name   string
	aborts []pgx.QueryExecMode
	run    func(ctx context.Context, tx pgx.Tx, key string) error
}{
	{"undefined table", []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}, func(ctx context.Context, tx pgx.Tx, key string) error {
		_, err := tx.Exec(ctx, `INSERT INTO no_such_table (key) VALUES ($1)`, key)
		return err
	}},
	{"syntax error", []pgx.QueryExecMode{pgx.QueryExecModeExec}, func(ctx context.Context, tx pgx.Tx, key string) error {
		_, err := tx.Exec(ctx, `INSRT INTO ledger (key) VALUES ($1)`, key)
		return err
	}},
	{"wrong argument count", []pgx.QueryExecMode{pgx.QueryExecModeExec}, func(ctx context.Context, tx pgx.Tx, key string) error {
		_, err := tx.Exec(ctx, `INSERT INTO ledger (key, node) VALUES ($1, $2)`, key)
		return err
	}},
	{"int4 overflow", []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}, func(ctx context.Context, tx pgx.Tx, key string) error {
		_, err := tx.Exec(ctx, `SELECT $1::int4`, int64(1)<<40)
		return err
	}},
	{"cancelled context", nil, func(ctx context.Context, tx pgx.Tx, key string) error {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := tx.Exec(cctx, `INSERT INTO ledger (key, node) VALUES ($1, 'cancelled')`, key)
		return err
	}},
}

// TestTxFirstStatementFailsBeforeRunning: the handler's first statement
// fails (firstStatementFailures), on pools in every exec
// mode; the handler ignores it, writes, and fails. Its write must have
// been in the transaction, rolled back with it: no ledger row. (A queue of
// BEGIN and savepoints, tried in 06091cf and reverted, did not send BEGIN
// again, and the write autocommitted: 1 row.) The retry, without the
// failing statement, writes once.
func TestTxFirstStatementFailsBeforeRunning(t *testing.T) {
	t.Parallel()
	pool, _ := atomicDB(t)
	for _, mode := range allExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			_, s := storeInMode(t, pool.Config().ConnString(), mode)
			for _, first := range firstStatementFailures {
				k := strings.ReplaceAll("first-fails-"+mode.String()+"-"+first.name, " ", "-")
				retry := false
				e := atomicRoute(t, s, func(c echo.Context) error {
					ctx, tx := c.Request().Context(), pgrecords.Tx(c)
					if !retry {
						if err := first.run(ctx, tx, k); err == nil {
							return fmt.Errorf("%s: the statement succeeded", first.name)
						}
					}
					if err := ledgerInsert(ctx, tx, k, "h"); err != nil {
						return err
					}
					if !retry {
						return errors.New("handler fails after its write")
					}
					return c.String(http.StatusCreated, "ok")
				}, nil)
				if rec := atomicSend(e, k); rec.Code/100 == 2 {
					t.Fatalf("%s: request = %d, want a failure", first.name, rec.Code)
				}
				if got := ledgerRows(t, pool, k); got != 0 {
					t.Errorf("%s: ledger rows = %d, want 0: the write ran outside the rolled-back transaction", first.name, got)
				}
				retry = true
				if rec := atomicSend(e, k); rec.Code != http.StatusCreated {
					t.Errorf("%s: retry = %d %s, want 201", first.name, rec.Code, rec.Body)
				}
				if got := ledgerRows(t, pool, k); got != 1 {
					t.Errorf("%s: ledger rows after the retry = %d, want 1", first.name, got)
				}
			}
		})
	}
}

// TestTxFirstStatementFailsThenAnswers: the handler's first statement
// fails (firstStatementFailures), on pools in every exec mode; the
// handler ignores it, writes, and answers 201 — in "checks" returning
// its write's error, in "ignores" answering 201 whatever the write did.
// An answer must be stored (and replayed) only together with the
// handler's write, committed in the transaction that finished the record;
// an answer that is not stored is not 2xx, nothing of it is written, and
// the retry runs.
//
// Unless the failing statement ran and aborted the transaction (aborts),
// the transaction is as it was before it, empty and usable, as after a
// failed statement the server never ran in a plain pgx transaction: the
// write commits with the answer, 201. Else the write fails (25P02), and so
// does the request. Before the fix the encoding failures (an argument
// count or value pgx refuses) closed the connection in the modes that
// prepare — BEGIN was queued, unsynced, in front of the statement — so
// the write failed ("checks": 500), or, ignored, the answer was completed
// alone, stored and replayed, and the write lost ("ignores").
func TestTxFirstStatementFailsThenAnswers(t *testing.T) {
	t.Parallel()
	pool, _ := atomicDB(t)
	for _, mode := range allExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			_, s := storeInMode(t, pool.Config().ConnString(), mode)
			for _, first := range firstStatementFailures {
				for _, ignores := range []bool{false, true} {
					name := first.name + map[bool]string{false: " checks", true: " ignores"}[ignores]
					k := strings.ReplaceAll("first-fails-answered-"+mode.String()+"-"+name, " ", "-")
					var firstErr error
					runs := 0
					e := atomicRoute(t, s, func(c echo.Context) error {
						runs++
						ctx, tx := c.Request().Context(), pgrecords.Tx(c)
						if runs == 1 {
							if firstErr = first.run(ctx, tx, k); firstErr == nil {
								return fmt.Errorf("%s: the statement succeeded", first.name)
							}
						}
						if err := ledgerInsert(ctx, tx, k, "h"); err != nil && !ignores {
							return err
						}
						return c.String(http.StatusCreated, "ok")
					}, nil)
					rec := atomicSend(e, k)
					want201 := !slices.Contains(first.aborts, mode)
					rows := ledgerRows(t, pool, k)
					var together bool
					if err := pool.QueryRow(testCtx(t), `SELECT EXISTS (SELECT 1 FROM ledger l JOIN idemgate_records r ON r.xmin = l.xmin
						WHERE l.key = $1 AND r.finished)`, k).Scan(&together); err != nil {
						t.Fatal(err)
					}
					again := atomicSend(e, k)
					replayed := again.Header().Get("Idempotent-Replayed") == "true"
					switch {
					case replayed && !together:
						t.Errorf("%s: the answer (%d) was stored and replayed without the handler's write (ledger rows %d; first statement: %v)",
							name, rec.Code, rows, firstErr)
					case rec.Code/100 == 2 && !replayed:
						t.Errorf("%s: the client got %d, and the retry = %d, not a replay", name, rec.Code, again.Code)
					case rec.Code/100 != 2 && (replayed || rows != 0):
						t.Errorf("%s: request = %d, yet the retry replayed (%v) or ledger rows = %d", name, rec.Code, replayed, rows)
					case want201 && rec.Code != http.StatusCreated:
						t.Errorf("%s: request = %d %s, want 201 (first statement: %v)", name, rec.Code, rec.Body, firstErr)
					case !want201 && rec.Code/100 == 2:
						t.Errorf("%s: request = %d, want a failure (first statement: %v)", name, rec.Code, firstErr)
					}
					if got := ledgerRows(t, pool, k); again.Code != http.StatusCreated || got != 1 {
						t.Errorf("%s: retry = %d, ledger rows %d; want 201 and 1", name, again.Code, got)
					}
					if wantRuns := map[bool]int{true: 1, false: 2}[replayed]; runs != wantRuns {
						t.Errorf("%s: the handler ran %d times, want %d (replayed: %v)", name, runs, wantRuns, replayed)
					}
				}
			}
		})
	}
}

// TestTxConnectionLostThenAnswers: a statement of the handler's outlives
// its context, and pgx closes the transaction's connection (the server
// rolls the transaction back when the session ends); the handler ignores
// that, tries to write (which fails: the connection is closed) and
// answers 201. The answer must not be stored on its own, whether the
// lost statement was the handler's first (BEGIN went out with it, and
// its result never came back) or a later one: 500, the claim released
// (tx_aborted), no ledger row, and the retry runs. Before the fix the
// first case was completed alone, on another connection of the pool:
// stored and replayed without the write; the second ended in a commit
// that failed (503 store_unavailable).
func TestTxConnectionLostThenAnswers(t *testing.T) {
	t.Parallel()
	pool, _ := atomicDB(t)
	for _, mode := range allExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			_, s := storeInMode(t, pool.Config().ConnString(), mode)
			for _, first := range []bool{true, false} {
				k := strings.ReplaceAll(fmt.Sprintf("conn-lost-%s-%v", mode, first), " ", "-")
				var events []idemgate.Event
				var lost error
				runs := 0
				e := atomicRoute(t, s, func(c echo.Context) error {
					runs++
					ctx, tx := c.Request().Context(), pgrecords.Tx(c)
					if runs == 1 {
						if !first {
							if err := ledgerInsert(ctx, tx, k, "before"); err != nil {
								return err
							}
						}
						sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
						_, lost = tx.Exec(sctx, `SELECT pg_sleep(1)`)
						cancel()
					}
					_ = ledgerInsert(ctx, tx, k, "h") // ignored
					return c.String(http.StatusCreated, "ok")
				}, func(c *middleware.Config) {
					c.OnEvent = func(_ context.Context, ev idemgate.Event) { events = append(events, ev) }
				})
				rec := atomicSend(e, k)
				if lost == nil {
					t.Fatalf("first %v: the statement outlived its context without an error (request %d %s)", first, rec.Code, rec.Body)
				}
				if rec.Code != http.StatusInternalServerError {
					t.Errorf("first %v: request = %d %s, want 500 (lost: %v)", first, rec.Code, rec.Body, lost)
				}
				if got := ledgerRows(t, pool, k); got != 0 {
					t.Errorf("first %v: ledger rows = %d, want 0", first, got)
				}
				released := false
				for _, ev := range events {
					released = released || ev.Type == idemgate.EventReleased && ev.Reason == "tx_aborted"
				}
				if !released {
					t.Errorf("first %v: events %v, want released tx_aborted", first, events)
				}
				if again := atomicSend(e, k); again.Code != http.StatusCreated || again.Header().Get("Idempotent-Replayed") == "true" || runs != 2 {
					t.Errorf("first %v: retry = %d replayed=%q after %d runs, want a second run", first, again.Code, again.Header().Get("Idempotent-Replayed"), runs)
				}
				if got := ledgerNodes(t, pool, k); got != "h" {
					t.Errorf("first %v: ledger after the retry = %q, want %q", first, got, "h")
				}
			}
		})
	}
}

// TestTxConnectionLostStaysLostAfterEncodeError: the transaction's
// connection is lost before BEGIN's answer came back (a savepoint's BEGIN
// outlives its context: pgx closes the connection), then the handler's
// next statement fails to encode, then it writes and answers 201, ignoring
// both errors. The lost connection must stay lost, as in
// TestTxConnectionLostThenAnswers: 500, claim released (tx_aborted), no
// ledger row, the retry runs. The encoding failure is the one that, as a
// first statement on an open connection, gives the connection back and
// takes another (lazyTx.notBegun); on a connection already closed it must
// not. Before the fix, in the modes that cache statements (where a
// connection that served the same statements before encodes them without
// a round trip), it did: the write went to a fresh transaction on another
// connection and the answer was stored, though the handler's connection had
// been lost. The pool has one connection, so that the warm-up request
// caches the statements on the connection the request takes.
func TestTxConnectionLostStaysLostAfterEncodeError(t *testing.T) {
	t.Parallel()
	pool, _ := atomicDB(t)
	for _, mode := range allExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			p, px := poolVia(t, pool.Config().ConnString(), func(c *pgxpool.Config) {
				c.MaxConns = 1
				c.ConnConfig.DefaultQueryExecMode = mode
			})
			s, err := pgrecords.New(testCtx(t), p)
			if err != nil {
				t.Fatal(err)
			}
			k := "lost-then-encode-" + strings.ReplaceAll(mode.String(), " ", "-")
			const insert = `INSERT INTO ledger (key, node) VALUES ($1, $2::text || $3::int4)`
			var events []idemgate.Event
			var lost, encode error
			runs := 0
			e := atomicRoute(t, s, func(c echo.Context) error {
				ctx, tx := c.Request().Context(), pgrecords.Tx(c)
				key := c.Request().Header.Get("Idempotency-Key")
				if key != k {
					if _, err := tx.Exec(ctx, insert, key, "warm", 1); err != nil {
						return err
					}
					return c.String(http.StatusCreated, "ok")
				}
				runs++
				if runs == 1 {
					px.DelayReplies(1, time.Second) // BEGIN's answer
					sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
					_, lost = tx.Begin(sctx)
					cancel()
					_, encode = tx.Exec(ctx, insert, key, "lost", int64(1)<<40)
				}
				_ = ledgerInsert(ctx, tx, key, "h") // ignored
				return c.String(http.StatusCreated, "ok")
			}, func(c *middleware.Config) {
				c.OnEvent = func(_ context.Context, ev idemgate.Event) { events = append(events, ev) }
			})
			if rec := atomicSend(e, k+"-warm"); rec.Code != http.StatusCreated {
				t.Fatalf("warm-up = %d %s", rec.Code, rec.Body)
			}
			events = nil
			rec := atomicSend(e, k)
			if lost == nil || encode == nil {
				t.Fatalf("the savepoint (%v) or the encoding (%v) did not fail", lost, encode)
			}
			if rec.Code != http.StatusInternalServerError {
				t.Errorf("request = %d %s, want 500 (savepoint: %v; encoding: %v)", rec.Code, rec.Body, lost, encode)
			}
			if got := ledgerRows(t, pool, k); got != 0 {
				t.Errorf("ledger rows = %d, want 0", got)
			}
			released := false
			for _, ev := range events {
				released = released || ev.Type == idemgate.EventReleased && ev.Reason == "tx_aborted"
			}
			if !released {
				t.Errorf("events %v, want released tx_aborted", events)
			}
			if again := atomicSend(e, k); again.Code != http.StatusCreated || again.Header().Get("Idempotent-Replayed") == "true" || runs != 2 {
				t.Errorf("retry = %d replayed=%q after %d runs, want a second run", again.Code, again.Header().Get("Idempotent-Replayed"), runs)
			}
			if got := ledgerNodes(t, pool, k); got != "h" {
				t.Errorf("ledger after the retry = %q, want %q", got, "h")
			}
		})
	}
}

// TestTxMultiStatementFirst: an Exec of several statements without
// arguments (the simple protocol, as pgx sends it) works as the
// handler's first statement, as it does later and in a plain pgx
// transaction: both rows commit with the answer. A failing one aborts the
// transaction, as in pgx (BEGIN ran): 500 tx_aborted when the handler
// answers anyway, nothing committed.
func TestTxMultiStatementFirst(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	e := atomicRoute(t, s, func(c echo.Context) error {
		ctx := c.Request().Context()
		key := c.Request().Header.Get("Idempotency-Key")
		sql := fmt.Sprintf(`INSERT INTO ledger (key, node) VALUES ('%s', 'one'); INSERT INTO ledger (key, node) VALUES ('%s', 'two')`, key, key)
		switch key {
		case "multi-failing":
			sql += `; SELECT 1/0`
		case "multi-syntax":
			sql += `; SELECT (`
		}
		tag, err := pgrecords.Tx(c).Exec(ctx, sql)
		switch {
		case key == "multi-syntax" && err != nil:
			// Nothing ran: the transaction is as it was, usable.
			if err := ledgerInsert(ctx, pgrecords.Tx(c), key, "after"); err != nil {
				return err
			}
		case err != nil && key != "multi-failing":
			return err
		}
		return c.String(http.StatusCreated, tag.String())
	}, nil)
	rec := atomicSend(e, "multi")
	if rec.Code != http.StatusCreated || rec.Body.String() != "INSERT 0 1" {
		t.Errorf("multi-statement first Exec = %d %q, want 201 %q", rec.Code, rec.Body, "INSERT 0 1")
	}
	if got := ledgerNodes(t, pool, "multi"); got != "one,two" {
		t.Errorf("committed %q, want %q", got, "one,two")
	}
	if rec := atomicSend(e, "multi-failing"); rec.Code != http.StatusInternalServerError {
		t.Errorf("a failing multi-statement first Exec, answered anyway = %d %q, want 500", rec.Code, rec.Body)
	}
	if got := ledgerNodes(t, pool, "multi-failing"); got != "" {
		t.Errorf("committed %q, want nothing", got)
	}
	// A syntax error: the server parses the whole string first and runs
	// none of it, BEGIN neither; the handler's next write commits with
	// its answer.
	if rec := atomicSend(e, "multi-syntax"); rec.Code != http.StatusCreated {
		t.Errorf("a multi-statement first Exec with a syntax error, then a write = %d %q, want 201", rec.Code, rec.Body)
	}
	if got := ledgerNodes(t, pool, "multi-syntax"); got != "after" {
		t.Errorf("committed %q, want %q", got, "after")
	}
}

// TestTxSavepointBeforeBegin: a savepoint begun before BEGIN ran (pgx's
// own transaction is begun for it), in two ways that fail: with a
// context already cancelled, after a first statement that failed to
// prepare, so that the connection is held but BEGIN never ran (nothing
// is sent; pgx closes a connection whose BEGIN fails other than with the
// server's error), and after a first statement that aborted the
// transaction. Each
// fails as it would in a plain pgx transaction, and leaves the
// transaction as pgx's: usable after the cancelled one (the write and the
// answer commit together, 201, replayed), aborted after the failed
// statement (500 tx_aborted when the handler answers anyway, nothing
// committed, the connection kept by pgx).
func TestTxSavepointBeforeBegin(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	var savepointErr error
	e := atomicRoute(t, s, func(c echo.Context) error {
		ctx, tx := c.Request().Context(), pgrecords.Tx(c)
		key := c.Request().Header.Get("Idempotency-Key")
		switch key {
		case "savepoint-cancelled":
			// Fails to prepare (the default exec mode prepares): nothing
			// ran, BEGIN neither, and the connection is kept.
			if _, err := tx.Exec(ctx, `INSERT INTO no_such_table VALUES ($1)`, 1); err == nil {
				return errors.New("an INSERT into no table succeeded")
			}
			cancelled, cancel := context.WithCancel(ctx)
			cancel()
			_, savepointErr = tx.Begin(cancelled)
		case "savepoint-aborted":
			_, _ = tx.Exec(ctx, `SELECT 1/$1::int`, 0)
			_, savepointErr = tx.Begin(ctx)
		}
		if err := ledgerInsert(ctx, tx, key, "h"); err != nil && key != "savepoint-aborted" {
			return err
		}
		return c.String(http.StatusCreated, "ok")
	}, nil)
	for _, tt := range []struct {
		key      string
		wantErr  string
		want     int
		wantRows int
	}{
		{key: "savepoint-cancelled", wantErr: "context canceled", want: 201, wantRows: 1},
		{key: "savepoint-aborted", wantErr: "25P02", want: 500, wantRows: 0},
	} {
		t.Run(tt.key, func(t *testing.T) {
			rec := atomicSend(e, tt.key)
			if savepointErr == nil || !strings.Contains(savepointErr.Error(), tt.wantErr) {
				t.Errorf("savepoint = %v, want an error with %q", savepointErr, tt.wantErr)
			}
			if rec.Code != tt.want {
				t.Errorf("request = %d %q, want %d", rec.Code, rec.Body, tt.want)
			}
			if got := ledgerRows(t, pool, tt.key); got != tt.wantRows {
				t.Errorf("ledger rows = %d, want %d", got, tt.wantRows)
			}
			if tt.want == 201 {
				if again := atomicSend(e, tt.key); again.Header().Get("Idempotent-Replayed") != "true" {
					t.Errorf("retry = %d replayed=%q, want the answer replayed", again.Code, again.Header().Get("Idempotent-Replayed"))
				}
			}
		})
	}
}
