package main

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/internal/wait"
)

// A request whose answer was lost on the way back (the connection broke
// after the request went out) may have reached the upstream: it must not
// be reported as never sent, which the handler would retry at once — a
// second upstream call for one task.
func TestUpstreamCallLostAnswerIsNotNotSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.PostgresDSN(t)
	admin, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	// The upstream's pool remembers its sockets, so that the test can cut
	// a request's answer off: the caller stops reading, the socket stays
	// open, and the server goes on as if nothing happened.
	var (
		mu    sync.Mutex
		socks []*severable
		cut   atomic.Bool
	)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if cut.Load() {
			// The partition: pgx's cancel request for the cut-off
			// statement does not get through either.
			return nil, errSevered
		}
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		sc := &severable{Conn: c}
		mu.Lock()
		socks = append(socks, sc)
		mu.Unlock()
		t.Cleanup(func() { c.Close() })
		return sc, nil
	}
	log, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(log.Close)
	up := upstream{gen: generator{took: 0}, log: log}
	if err := up.prepare(ctx); err != nil {
		t.Fatal(err)
	}

	// The request waits in the upstream, while it is being logged, on an
	// advisory lock the test holds.
	if _, err := admin.Exec(ctx, `CREATE FUNCTION attack_hold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_advisory_xact_lock(4242);
	RETURN NEW;
END $$;
CREATE TRIGGER attack_hold BEFORE INSERT ON idemgate_example_upstream_calls
	FOR EACH ROW EXECUTE FUNCTION attack_hold()`); err != nil {
		t.Fatal(err)
	}
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(4242)"); err != nil {
		t.Fatal(err)
	}
	const ref = "00000000-0000-0000-0000-00000000a7ac"
	got := make(chan error, 1)
	go func() {
		_, err := up.call(ctx, ref, imageParams{Prompt: "a cat", AspectRatio: "1:1", N: 1}, 0)
		got <- err
	}()
	wait.For(t, time.Minute, "the upstream's INSERT held by the lock", func() bool {
		var n int
		_ = admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO idemgate_example_upstream_calls%'`).Scan(&n)
		return n == 1
	})
	// The caller's connection breaks; then the upstream goes on and logs it.
	cut.Store(true)
	mu.Lock()
	for _, c := range socks {
		c.sever()
	}
	mu.Unlock()
	err = <-got
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	cut.Store(false)
	wait.For(t, time.Minute, "the upstream's log of the call", func() bool {
		var n int
		err := admin.QueryRow(ctx, "SELECT count(*) FROM idemgate_example_upstream_calls WHERE ref = $1", ref).Scan(&n)
		return err == nil && n == 1
	})
	if err == nil {
		t.Fatal("call succeeded on a broken connection")
	}
	if errors.Is(err, errNotSent) {
		t.Fatalf("call reported %v as never sent, but the upstream received it", err)
	}
}

// severable is a connection whose reads the test can cut off while the
// socket stays open (Close leaves it to the test's cleanup).
type severable struct {
	net.Conn
	severed atomic.Bool
}

var errSevered = errors.New("test: connection severed")

func (c *severable) sever() {
	c.severed.Store(true)
	_ = c.Conn.SetReadDeadline(time.Now())
}

func (c *severable) Read(b []byte) (int, error) {
	if c.severed.Load() {
		return 0, errSevered
	}
	n, err := c.Conn.Read(b)
	if c.severed.Load() {
		return 0, errSevered
	}
	return n, err
}

func (c *severable) Write(b []byte) (int, error) {
	if c.severed.Load() {
		return 0, errSevered
	}
	return c.Conn.Write(b)
}

func (c *severable) Close() error { return nil }

// Each call is logged with the name of the worker that made it, so that a
// second call for one task can be traced to its process (the chaos
// checker's invariant 5); a process without a name logs none.
func TestUpstreamLogsTheCaller(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	p := imageParams{Prompt: "a lighthouse", AspectRatio: "1:1", N: 1}
	for _, caller := range []string{"worker-2", ""} {
		up := upstream{gen: generator{}, log: pool, caller: caller}
		if err := up.prepare(ctx); err != nil {
			t.Fatal(err)
		}
		ref := "task-of-" + caller
		if _, err := up.call(ctx, ref, p, 0); err != nil {
			t.Fatal(err)
		}
		var got *string
		if err := pool.QueryRow(ctx, `SELECT caller FROM idemgate_example_upstream_calls WHERE ref = $1`, ref).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if (caller == "") != (got == nil) || (got != nil && *got != caller) {
			t.Fatalf("caller logged as %v, want %q", got, caller)
		}
	}
}
