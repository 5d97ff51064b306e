package pgrecords_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	echomw "github.com/labstack/echo/v4/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/internal/wait"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/redisstore"
)

// ledgerDDL is the handler's own table in the Atomic tests: one row per
// run of the export handler that committed.
const ledgerDDL = `CREATE TABLE IF NOT EXISTS ledger (key text NOT NULL, node text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`

// atomicNode is one API node: an echo app whose POST /v1/export runs
// Atomic on store, writes a ledger row through pgrecords.Tx and then does
// what the request's X-Mode says.
type atomicNode struct {
	e     *echo.Echo
	runs  atomic.Int64
	gate  chan struct{} // X-Mode "wait" blocks on it after the write, "late" before
	entry chan struct{} // X-Mode "wait" and "late": a send when the handler blocks
}

func newAtomicNode(t *testing.T, name string, store idemgate.Store, configure func(*middleware.Config)) *atomicNode {
	t.Helper()
	n := &atomicNode{e: echo.New(), gate: make(chan struct{}), entry: make(chan struct{}, 16)}
	cfg := middleware.Config{
		Store:  store,
		Scope:  func(c echo.Context) (string, string, error) { return "acme", "alice", nil },
		Kind:   "export",
		Atomic: true,
	}
	if configure != nil {
		configure(&cfg)
	}
	mw, err := cfg.ToMiddleware()
	if err != nil {
		t.Fatal(err)
	}
	n.e.Use(echomw.Recover())
	n.e.POST("/v1/export", func(c echo.Context) error {
		n.runs.Add(1)
		tx := pgrecords.Tx(c)
		if tx == nil {
			return errors.New("no transaction on an Atomic route")
		}
		key := c.Request().Header.Get("Idempotency-Key")
		if c.Request().Header.Get("X-Mode") == "late" { // wait, then write
			n.entry <- struct{}{}
			<-n.gate
		}
		if _, err := tx.Exec(c.Request().Context(), `INSERT INTO ledger (key, node) VALUES ($1, $2)`, key, name); err != nil {
			return err
		}
		switch c.Request().Header.Get("X-Mode") {
		case "error":
			return errors.New("handler failed after its write")
		case "panic":
			panic("handler panicked after its write")
		case "500":
			return c.JSON(http.StatusInternalServerError, map[string]string{"error": "upstream"})
		case "409":
			return c.JSON(http.StatusConflict, map[string]string{"error": "busy"})
		case "big":
			return c.Blob(http.StatusCreated, "text/plain", bytes.Repeat([]byte("x"), 4096))
		case "wait":
			n.entry <- struct{}{}
			<-n.gate
		case "flush":
			c.Response().Header().Set("Content-Type", "text/plain")
			c.Response().WriteHeader(http.StatusCreated)
			c.Response().Write([]byte("part one;"))
			c.Response().Flush()
			if _, _, err := c.Response().Hijack(); err == nil {
				return errors.New("hijack succeeded on an Atomic route")
			}
			_, err := c.Response().Write([]byte("part two"))
			return err
		}
		return c.JSON(http.StatusCreated, map[string]string{"exported": key, "node": name})
	}, mw)
	return n
}

func (n *atomicNode) send(key, mode string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/v1/export", strings.NewReader(`{"report":"q3"}`))
	r.Header.Set("Content-Type", "application/json")
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	r.Header.Set("X-Mode", mode)
	w := httptest.NewRecorder()
	n.e.ServeHTTP(w, r)
	return w
}

// atomicDB returns a migrated store on a fresh database with the ledger.
func atomicDB(t *testing.T) (*pgxpool.Pool, *pgrecords.Store) {
	t.Helper()
	pool := newPool(t, testenv.PostgresDSN(t))
	s := newStore(t, pool)
	if _, err := pool.Exec(testCtx(t), ledgerDDL); err != nil {
		t.Fatal(err)
	}
	return pool, s
}

func ledgerRows(t *testing.T, pool *pgxpool.Pool, key string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(testCtx(t), `SELECT count(*) FROM ledger WHERE key = $1`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// ledgerNodes returns the nodes of key's committed ledger rows, in the
// order they were written, joined by commas.
func ledgerNodes(t *testing.T, pool *pgxpool.Pool, key string) string {
	t.Helper()
	rows, _ := pool.Query(testCtx(t), `SELECT node FROM ledger WHERE key = $1 ORDER BY at`, key)
	nodes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(nodes, ",")
}

// ledgerInsert writes a ledger row through tx.
func ledgerInsert(ctx context.Context, tx pgx.Tx, key, node string) error {
	_, err := tx.Exec(ctx, `INSERT INTO ledger (key, node) VALUES ($1, $2)`, key, node)
	return err
}

// TestAtomicCommitsTogether: the handler's write and the stored answer
// commit together; the retry replays it without a second write.
func TestAtomicCommitsTogether(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	n := newAtomicNode(t, "a", s, nil)
	first := n.send("k1", "ok")
	if first.Code != http.StatusCreated {
		t.Fatalf("first = %d %s", first.Code, first.Body)
	}
	if got := ledgerRows(t, pool, "k1"); got != 1 {
		t.Errorf("ledger rows = %d, want 1", got)
	}
	again := n.send("k1", "ok")
	if again.Code != http.StatusCreated || again.Header().Get("Idempotent-Replayed") != "true" || again.Body.String() != first.Body.String() {
		t.Errorf("retry = %d replayed=%q %s, want the first answer replayed", again.Code, again.Header().Get("Idempotent-Replayed"), again.Body)
	}
	if got := ledgerRows(t, pool, "k1"); got != 1 || n.runs.Load() != 1 {
		t.Errorf("after the replay: %d ledger rows, %d runs; want 1 and 1", got, n.runs.Load())
	}
}

// TestAtomicRollsBack: an error, a panic, a handler's own 5xx or 409 and
// an answer over MaxResponseBytes roll the handler's write back and
// release the claim: the retry runs, and only its write stays.
func TestAtomicRollsBack(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	n := newAtomicNode(t, "a", s, func(c *middleware.Config) { c.MaxResponseBytes = 1024 })
	tests := []struct {
		mode       string
		wantStatus int
		wantCode   string
	}{
		{mode: "error", wantStatus: 500},
		{mode: "panic", wantStatus: 500},
		{mode: "500", wantStatus: 500},
		{mode: "409", wantStatus: 409},
		{mode: "big", wantStatus: 500, wantCode: string(idemgate.CodeResponseTooLarge)},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			key := "rollback-" + tt.mode
			rec := n.send(key, tt.mode)
			if rec.Code != tt.wantStatus || (tt.wantCode != "" && !strings.Contains(rec.Body.String(), `"code":"`+tt.wantCode+`"`)) {
				t.Errorf("%s = %d %s, want %d %s", tt.mode, rec.Code, rec.Body, tt.wantStatus, tt.wantCode)
			}
			if tt.mode == "big" && strings.Contains(rec.Body.String(), "xxxx") {
				t.Errorf("the rolled back answer reached the client")
			}
			if got := ledgerRows(t, pool, key); got != 0 {
				t.Errorf("after %s: %d ledger rows, want 0 (rolled back)", tt.mode, got)
			}
			retry := n.send(key, "ok")
			if retry.Code != http.StatusCreated || retry.Header().Get("Idempotent-Replayed") == "true" {
				t.Errorf("retry = %d replayed=%q, want a run", retry.Code, retry.Header().Get("Idempotent-Replayed"))
			}
			if got := ledgerRows(t, pool, key); got != 1 {
				t.Errorf("after the retry: %d ledger rows, want 1", got)
			}
		})
	}
}

// TestAtomicHoldsTheAnswer: on an Atomic route Flush does nothing (the
// whole answer goes out after the commit) and Hijack fails.
func TestAtomicHoldsTheAnswer(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	n := newAtomicNode(t, "a", s, nil)
	srv := httptest.NewServer(n.e)
	t.Cleanup(srv.Close)
	r, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/export", strings.NewReader(`{}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", "flush")
	r.Header.Set("X-Mode", "flush")
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	body.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusCreated || body.String() != "part one;part two" {
		t.Fatalf("flushing handler = %d %q, want 201 with both parts", resp.StatusCode, body.String())
	}
	if got := ledgerRows(t, pool, "flush"); got != 1 {
		t.Errorf("ledger rows = %d, want 1", got)
	}
}

// TestAtomicWithoutKey: a request without a key on an Atomic route gets a
// transaction of its own, committed for an answer that would be stored
// and rolled back otherwise.
func TestAtomicWithoutKey(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	n := newAtomicNode(t, "a", s, nil)
	if rec := n.send("", "ok"); rec.Code != http.StatusCreated {
		t.Fatalf("without a key = %d %s", rec.Code, rec.Body)
	}
	if rec := n.send("", "500"); rec.Code != http.StatusInternalServerError {
		t.Fatalf("without a key, failing = %d %s", rec.Code, rec.Body)
	}
	if got := ledgerRows(t, pool, ""); got != 1 {
		t.Errorf("ledger rows of keyless requests = %d, want 1 (the 500 rolled back)", got)
	}
}

// TestAtomicConfig: only a TxStore can be Atomic, and never with FailOpen;
// outside an Atomic route Tx is nil.
func TestAtomicConfig(t *testing.T) {
	t.Parallel()
	scope := func(echo.Context) (string, string, error) { return "t", "u", nil }
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { rdb.Close() })
	_, err := middleware.Config{Store: redisstore.New(rdb), Scope: scope, Atomic: true}.ToMiddleware()
	if err == nil || !strings.Contains(err.Error(), "TxStore") {
		t.Errorf("Atomic on Redis: err = %v, want one naming TxStore", err)
	}
	_, s := atomicDB(t)
	_, err = middleware.Config{Store: s, Scope: scope, Atomic: true, FailOpen: true}.ToMiddleware()
	if err == nil || !strings.Contains(err.Error(), "FailOpen") {
		t.Errorf("Atomic with FailOpen: err = %v, want one naming FailOpen", err)
	}
	if tx := pgrecords.TxFromContext(context.Background()); tx != nil {
		t.Errorf("TxFromContext outside an Atomic route = %v; want nil", tx)
	}
	e := echo.New()
	var seen atomic.Bool
	e.POST("/", func(c echo.Context) error {
		seen.Store(pgrecords.Tx(c) != nil)
		return c.NoContent(http.StatusNoContent)
	}, middleware.New(middleware.Config{Store: s, Scope: scope}))
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("x"))
	r.Header.Set("Idempotency-Key", "k")
	e.ServeHTTP(httptest.NewRecorder(), r)
	if seen.Load() {
		t.Errorf("Tx on a route that is not Atomic is not nil")
	}
}

// stalled is a store whose renewals do nothing: its claims run out while
// the handler runs, as a node's do when it cannot reach the database.
type stalled struct{ *pgrecords.Store }

func (stalled) Extend(context.Context, string, idemgate.Token, time.Duration) error { return nil }

// TestAtomicLostClaimCannotCommit: a node whose claim ran out while its
// handler ran, and whose key another node took over and finished, cannot
// commit: its write rolls back, its client gets 503 lease_lost, and the
// other node's run is the only one in the ledger.
func TestAtomicLostClaimCannotCommit(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	// The slow node's transaction sits idle from its write until the gate
	// opens, and the server ends it at twice the lease (its idle limit):
	// then its commit fails on a dead session (503 store_unavailable), not
	// on the lost claim. So the other node's claim, run and commit, and
	// the slow node's commit, must fit in the lease after it ran out; with
	// 500 ms, a loaded machine's round trips may not.
	const lease = 2 * time.Second
	slow := newAtomicNode(t, "slow", stalled{s}, func(c *middleware.Config) { c.Lease = lease })
	other := newAtomicNode(t, "other", s, nil)
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- slow.send("lost", "wait") }()
	<-slow.entry
	var took *httptest.ResponseRecorder
	wait.For(t, 30*time.Second, "the other node takes the key over", func() bool {
		took = other.send("lost", "ok")
		return took.Code == http.StatusCreated
	})
	close(slow.gate)
	rec := <-done
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), `"code":"lease_lost"`) {
		t.Errorf("the node that lost its claim answered %d %s, want 503 lease_lost", rec.Code, rec.Body)
	}
	if strings.Contains(rec.Body.String(), "exported") {
		t.Errorf("the rolled back answer reached the client")
	}
	var nodes []string
	rows, _ := pool.Query(testCtx(t), `SELECT node FROM ledger WHERE key = 'lost'`)
	for rows.Next() {
		var n string
		rows.Scan(&n)
		nodes = append(nodes, n)
	}
	if fmt.Sprint(nodes) != "[other]" {
		t.Errorf("ledger rows by %v, want only the other node's", nodes)
	}
	if again := other.send("lost", "ok"); again.Header().Get("Idempotent-Replayed") != "true" || again.Body.String() != took.Body.String() {
		t.Errorf("retry = %d %s, want the other node's answer replayed", again.Code, again.Body)
	}
}

// TestAtomicConcurrentRequests: many requests with one key on two nodes
// at once: one run commits, every request gets its answer.
func TestAtomicConcurrentRequests(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	wait := func(c *middleware.Config) { c.WaitInFlight = 30 * time.Second }
	nodes := []*atomicNode{newAtomicNode(t, "a", s, wait), newAtomicNode(t, "b", newStore(t, newPool(t, pool.Config().ConnString())), wait)}
	for round := range 3 {
		key := fmt.Sprintf("race-%d", round)
		const n = 32
		answers := make([]*httptest.ResponseRecorder, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { answers[i] = nodes[i%2].send(key, "ok") })
		}
		wg.Wait()
		for i, a := range answers {
			if a.Code != http.StatusCreated || a.Body.String() != answers[0].Body.String() {
				t.Errorf("round %d: answer %d = %d %s, want 201 %s", round, i, a.Code, a.Body, answers[0].Body)
			}
		}
		if got := ledgerRows(t, pool, key); got != 1 {
			t.Errorf("round %d: %d ledger rows, want 1", round, got)
		}
	}
}

// TestAtomicTxMethods: whichever method the handler's first statement
// uses, it runs in the transaction (BEGIN goes out with it), and every
// later statement too; a savepoint rolled back undoes only its part; a
// handler that sends no statement still stores its answer.
func TestAtomicTxMethods(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	insert := `INSERT INTO ledger (key, node) VALUES ($1, $2)`
	tests := []struct {
		name  string
		run   func(ctx context.Context, tx pgx.Tx, key string) error
		wantN int
	}{
		{"exec", func(ctx context.Context, tx pgx.Tx, key string) error {
			_, err := tx.Exec(ctx, insert, key, "exec")
			return err
		}, 1},
		{"query row", func(ctx context.Context, tx pgx.Tx, key string) error {
			var n int
			if err := tx.QueryRow(ctx, insert+` RETURNING 1`, key, "row").Scan(&n); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, insert, key, "second")
			return err
		}, 2},
		{"query", func(ctx context.Context, tx pgx.Tx, key string) error {
			rows, err := tx.Query(ctx, `SELECT g FROM generate_series(1, 3) AS g`)
			if err != nil {
				return err
			}
			nums, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			if err != nil || len(nums) != 3 {
				return fmt.Errorf("rows %v, %v", nums, err)
			}
			_, err = tx.Exec(ctx, insert, key, "after rows")
			return err
		}, 1},
		{"batch", func(ctx context.Context, tx pgx.Tx, key string) error {
			b := &pgx.Batch{}
			b.Queue(insert, key, "b1")
			b.Queue(insert, key, "b2")
			return tx.SendBatch(ctx, b).Close()
		}, 2},
		{"savepoint", func(ctx context.Context, tx pgx.Tx, key string) error {
			if _, err := tx.Exec(ctx, insert, key, "kept"); err != nil {
				return err
			}
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, insert, key, "undone"); err != nil {
				return err
			}
			return sp.Rollback(ctx)
		}, 1},
		{"no statement", func(context.Context, pgx.Tx, string) error { return nil }, 0},
		{"no query row", func(ctx context.Context, tx pgx.Tx, key string) error {
			var n int
			if err := tx.QueryRow(ctx, `SELECT 1 WHERE false`).Scan(&n); !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("QueryRow of nothing = %v, want pgx.ErrNoRows", err)
			}
			_, err := tx.Exec(ctx, insert, key, "after no row")
			return err
		}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := echo.New()
			e.POST("/", func(c echo.Context) error {
				tx := pgrecords.Tx(c)
				if err := tx.Commit(c.Request().Context()); err == nil {
					return errors.New("the handler committed its request's transaction")
				}
				if err := tt.run(c.Request().Context(), tx, c.Request().Header.Get("Idempotency-Key")); err != nil {
					return err
				}
				return c.String(http.StatusCreated, tt.name)
			}, middleware.New(middleware.Config{Store: s, Atomic: true,
				Scope: func(echo.Context) (string, string, error) { return "acme", "alice", nil }}))
			for i := range 2 {
				r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tt.name))
				r.Header.Set("Idempotency-Key", "methods-"+strings.ReplaceAll(tt.name, " ", "-"))
				w := httptest.NewRecorder()
				e.ServeHTTP(w, r)
				if w.Code != http.StatusCreated || w.Body.String() != tt.name || (i == 1) != (w.Header().Get("Idempotent-Replayed") == "true") {
					t.Fatalf("request %d = %d %q replayed=%q", i, w.Code, w.Body, w.Header().Get("Idempotent-Replayed"))
				}
			}
			if got := ledgerRows(t, pool, "methods-"+strings.ReplaceAll(tt.name, " ", "-")); got != tt.wantN {
				t.Errorf("ledger rows = %d, want %d", got, tt.wantN)
			}
		})
	}
}
