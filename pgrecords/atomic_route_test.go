package pgrecords_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
)

// TestAtomicWriteThenError: the handler writes 201 and a body, flushes,
// then returns echo.NewHTTPError(400): nothing of the 201 may reach the
// client, the write rolls back, the retry runs.
func TestAtomicWriteThenError(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	fail := true
	e := atomicRoute(t, s, func(c echo.Context) error {
		if _, err := pgrecords.Tx(c).Exec(c.Request().Context(), `INSERT INTO ledger (key, node) VALUES ('write-then-error', 'h')`); err != nil {
			return err
		}
		c.Response().Header().Set("X-Partial", "1")
		c.Response().WriteHeader(http.StatusCreated)
		_, _ = c.Response().Write([]byte("partial-201"))
		c.Response().Flush()
		if fail {
			return echo.NewHTTPError(http.StatusBadRequest, "changed my mind")
		}
		return nil
	}, nil)
	rec := atomicSend(e, "write-then-error")
	if rec.Code != http.StatusBadRequest || strings.Contains(rec.Body.String(), "partial") || rec.Header().Get("X-Partial") != "" {
		t.Errorf("answer = %d X-Partial=%q %s, want echo's 400 alone", rec.Code, rec.Header().Get("X-Partial"), rec.Body)
	}
	if got := ledgerRows(t, pool, "write-then-error"); got != 0 {
		t.Errorf("ledger rows = %d, want 0", got)
	}
	fail = false
	if rec := atomicSend(e, "write-then-error"); rec.Code != http.StatusCreated || rec.Body.String() != "partial-201" {
		t.Errorf("retry = %d %s", rec.Code, rec.Body)
	}
	if got := ledgerRows(t, pool, "write-then-error"); got != 1 {
		t.Errorf("ledger rows = %d, want 1", got)
	}
}

// TestAtomicWaiterAfterRollback: a duplicate waits (WaitInFlight) on an
// Atomic holder that then fails and rolls back: the waiter must get a run
// of its own (or a retryable answer), never the holder's rolled-back 201.
func TestAtomicWaiterAfterRollback(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	entered, gate := make(chan struct{}, 2), make(chan struct{})
	e := atomicRoute(t, s, func(c echo.Context) error {
		if _, err := pgrecords.Tx(c).Exec(c.Request().Context(), `INSERT INTO ledger (key, node) VALUES ('waiter', $1)`, c.Request().Header.Get("X-Who")); err != nil {
			return err
		}
		if c.Request().Header.Get("X-Who") == "holder" {
			entered <- struct{}{}
			<-gate
			return c.String(http.StatusServiceUnavailable, "holder failed")
		}
		return c.String(http.StatusCreated, "waiter ran")
	}, func(c *middleware.Config) { c.WaitInFlight = 20 * time.Second })
	send := func(who string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", "waiter")
		r.Header.Set("X-Who", who)
		w := httptest.NewRecorder()
		e.ServeHTTP(w, r)
		return w
	}
	holder := make(chan *httptest.ResponseRecorder, 1)
	go func() { holder <- send("holder") }()
	<-entered
	waiter := make(chan *httptest.ResponseRecorder, 1)
	go func() { waiter <- send("waiter") }()
	time.Sleep(500 * time.Millisecond)
	close(gate)
	if h := <-holder; h.Code != http.StatusServiceUnavailable {
		t.Errorf("holder = %d %s", h.Code, h.Body)
	}
	w := <-waiter
	t.Logf("waiter = %d %s", w.Code, w.Body)
	if w.Code/100 == 2 && w.Body.String() != "waiter ran" {
		t.Errorf("waiter got %d %q", w.Code, w.Body)
	}
	var nodes []string
	rows, _ := pool.Query(testCtx(t), `SELECT node FROM ledger WHERE key = 'waiter'`)
	for rows.Next() {
		var n string
		_ = rows.Scan(&n)
		nodes = append(nodes, n)
	}
	if w.Code == http.StatusCreated && strings.Join(nodes, ",") != "waiter" {
		t.Errorf("committed rows by %v, want [waiter]", nodes)
	}
}

// TestAtomicUnprotectedAndKeyless: a GET on an Atomic group and a POST
// without a key (Required false) get transactions of their own, committed
// on a stored-kind status, rolled back otherwise; FromContext says no key.
func TestAtomicUnprotectedAndKeyless(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	mw, err := middleware.Config{Store: s, Atomic: true,
		Scope: func(echo.Context) (string, string, error) { return "acme", "alice", nil }}.ToMiddleware()
	if err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	g := e.Group("", mw)
	h := func(c echo.Context) error {
		tx := pgrecords.Tx(c)
		if tx == nil {
			return c.String(http.StatusTeapot, "no tx")
		}
		if _, ok := middleware.FromContext(c); ok {
			return c.String(http.StatusTeapot, "a key on a keyless request")
		}
		if _, err := tx.Exec(c.Request().Context(), `INSERT INTO ledger (key, node) VALUES ('unprotected', $1)`, c.Request().Method+c.QueryParam("s")); err != nil {
			return err
		}
		if c.QueryParam("s") == "500" {
			return c.String(http.StatusInternalServerError, "x")
		}
		return c.String(http.StatusOK, "ok")
	}
	g.GET("/", h)
	g.POST("/", h)
	for _, tc := range []struct{ method, q string }{{"GET", ""}, {"GET", "500"}, {"POST", ""}, {"POST", "500"}} {
		r := httptest.NewRequest(tc.method, "/?s="+tc.q, nil)
		w := httptest.NewRecorder()
		e.ServeHTTP(w, r)
		if w.Code == http.StatusTeapot {
			t.Errorf("%s ?s=%s: %s", tc.method, tc.q, w.Body)
		}
	}
	var got int
	_ = pool.QueryRow(testCtx(t), `SELECT count(*) FROM ledger WHERE key = 'unprotected'`).Scan(&got)
	if got != 2 {
		t.Errorf("ledger rows = %d, want 2 (the two 500s rolled back)", got)
	}
}

// TestAtomicClientGoneMidHandler: the client disconnects (request context
// cancelled) after the handler's write; the handler finishes with a 201
// anyway (it ignores its context after the write). The answer is
// complete, so it must commit (the retry replays it), not vanish.
func TestAtomicClientGoneMidHandler(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	wrote, gate := make(chan struct{}, 1), make(chan struct{})
	e := atomicRoute(t, s, func(c echo.Context) error {
		if _, err := pgrecords.Tx(c).Exec(c.Request().Context(), `INSERT INTO ledger (key, node) VALUES ('client-gone', 'h')`); err != nil {
			return err
		}
		wrote <- struct{}{}
		<-gate
		return c.String(http.StatusCreated, "done")
	}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{}`)).WithContext(ctx)
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", "client-gone")
	done := make(chan struct{})
	go func() { e.ServeHTTP(httptest.NewRecorder(), r); close(done) }()
	<-wrote
	cancel()
	time.Sleep(200 * time.Millisecond)
	close(gate)
	<-done
	retry := atomicSend(e, "client-gone")
	if retry.Header().Get("Idempotent-Replayed") != "true" || ledgerRows(t, pool, "client-gone") != 1 {
		t.Errorf("retry = %d replayed=%q, ledger rows %d: want the first run's answer replayed and one row",
			retry.Code, retry.Header().Get("Idempotent-Replayed"), ledgerRows(t, pool, "client-gone"))
	}
}

// TestAtomicResponseSize: echo's Response.Size (what access logs print as
// bytes_out) must be the body's size on an Atomic route too.
func TestAtomicResponseSize(t *testing.T) {
	t.Parallel()
	_, s := atomicDB(t)
	body := strings.Repeat("b", 1000)
	var size int64
	mw, err := middleware.Config{Store: s, Atomic: true,
		Scope: func(echo.Context) (string, string, error) { return "acme", "alice", nil }}.ToMiddleware()
	if err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			err := next(c)
			size = c.Response().Size
			return err
		}
	})
	e.POST("/", func(c echo.Context) error { return c.String(http.StatusCreated, body) }, mw)
	for _, key := range []string{"size", ""} {
		rec := atomicSend(e, key)
		if rec.Body.Len() != len(body) || size != int64(len(body)) {
			t.Errorf("key %q: body %d bytes, echo's Response.Size = %d", key, rec.Body.Len(), size)
		}
	}
}

// TestAtomicLateHeader: a header the handler sets after WriteHeader does
// not reach a client on a plain route (net/http sent the headers). On an
// Atomic route the headers go out after the commit, so the first client
// sees it, while the stored copy (taken at WriteHeader) lacks it: the
// replay differs from the first answer.
func TestAtomicLateHeader(t *testing.T) {
	t.Parallel()
	_, s := atomicDB(t)
	e := atomicRoute(t, s, func(c echo.Context) error {
		c.Response().Header().Set("Content-Type", "text/plain")
		c.Response().WriteHeader(http.StatusCreated)
		c.Response().Header().Set("X-Late", "1")
		_, err := c.Response().Write([]byte("ok"))
		return err
	}, nil)
	first := atomicSend(e, "late-header")
	again := atomicSend(e, "late-header")
	if first.Header().Get("X-Late") != again.Header().Get("X-Late") {
		t.Errorf("first answer X-Late=%q, replay X-Late=%q: the replay differs from the first answer",
			first.Header().Get("X-Late"), again.Header().Get("X-Late"))
	}
}

// TestAtomicBigUncacheable: a handler's own 429 (or 503) with Retry-After
// and a body over MaxResponseBytes is not stored either way; on an
// Atomic route what does the client get?
func TestAtomicBigUncacheable(t *testing.T) {
	t.Parallel()
	_, s := atomicDB(t)
	e := atomicRoute(t, s, func(c echo.Context) error {
		c.Response().Header().Set("Retry-After", "7")
		return c.Blob(http.StatusTooManyRequests, "text/plain", bytes.Repeat([]byte("x"), 2048))
	}, func(c *middleware.Config) { c.MaxResponseBytes = 1024 })
	rec := atomicSend(e, "big-429")
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "7" {
		t.Errorf("handler's 429 Retry-After 7 over MaxResponseBytes reached the client as %d Retry-After=%q %.120s",
			rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
}

// TestAtomicTrailersDropped: trailers a handler declares and sets after
// WriteHeader (net/http's Trailer header, or http.TrailerPrefix) follow
// the body on a plain route. An Atomic route holds the answer as it stood
// at WriteHeader and stores no trailers: they are dropped, from the first
// answer (the declaration goes out, without a value) as from the replay;
// status and body are whole.
func TestAtomicTrailersDropped(t *testing.T) {
	t.Parallel()
	_, s := atomicDB(t)
	e := atomicRoute(t, s, func(c echo.Context) error {
		h := c.Response().Header()
		h.Set("Trailer", "X-Checksum")
		h.Set("Content-Type", "text/plain")
		c.Response().WriteHeader(http.StatusCreated)
		if _, err := c.Response().Write([]byte("body")); err != nil {
			return err
		}
		h.Set("X-Checksum", "abc")
		h.Set(http.TrailerPrefix+"X-Late", "def")
		return nil
	}, nil)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	for _, name := range []string{"first", "replay"} {
		r, _ := http.NewRequest(http.MethodPost, srv.URL+"/", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "trailers")
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		var body bytes.Buffer
		body.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || body.String() != "body" {
			t.Fatalf("%s = %d %q", name, resp.StatusCode, body.String())
		}
		if resp.Trailer.Get("X-Checksum") != "" || resp.Trailer.Get("X-Late") != "" {
			t.Errorf("%s: trailers %v, want none: an Atomic route drops them", name, resp.Trailer)
		}
	}
}

// TestAtomicEarlyHints: echo's WriteHeader(103) (Early Hints) and then
// NoContent. Echo marks its response committed at the 103 and drops every
// WriteHeader after it, so the final status never reaches the middleware;
// on a plain echo route net/http then sends 200. The Atomic route commits
// and stores that 200 (it answered 503 store_unavailable, for every
// retry, before): the write is in once, the retry replays.
func TestAtomicEarlyHints(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	e := atomicRoute(t, s, func(c echo.Context) error {
		if err := ledgerInsert(c.Request().Context(), pgrecords.Tx(c), "early-hints", "h"); err != nil {
			return err
		}
		c.Response().Header().Set("Link", "</style.css>; rel=preload")
		c.Response().WriteHeader(http.StatusEarlyHints)
		return c.NoContent(http.StatusNoContent)
	}, nil)
	first := atomicSend(e, "early-hints")
	if first.Code != http.StatusOK {
		t.Errorf("first = %d %q, want 200 (echo dropped the 204)", first.Code, first.Body)
	}
	again := atomicSend(e, "early-hints")
	if again.Code != first.Code || again.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry = %d replayed=%q %q, want the first answer replayed", again.Code, again.Header().Get("Idempotent-Replayed"), again.Body)
	}
	if got := ledgerRows(t, pool, "early-hints"); got != 1 {
		t.Errorf("ledger rows = %d, want 1", got)
	}
}
