package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/opsbench"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/internal/wait"
	"github.com/idemgate/idemgate/pgstore"
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
		_, err := up.call(ctx, ref, "", imageParams{Prompt: "a cat", AspectRatio: "1:1", N: 1}, 0)
		got <- err
	}()
	wait.For(t, time.Minute, "the upstream's INSERT held by the lock", func() bool {
		var n int
		_ = admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%INSERT INTO idemgate_example_upstream_calls%'`).Scan(&n)
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
		if _, err := up.call(ctx, ref, "", p, 0); err != nil {
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

// The stand-in upstream charges once per idempotency key, as a paid API
// that takes one does: a request under a key it has seen, at once or
// later, joins that job and gets its answer; without a key every request
// is a job of its own.
func TestUpstreamChargesOncePerKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	up := upstream{gen: generator{took: 50 * time.Millisecond}, log: pool}
	if err := up.prepare(ctx); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		given       string // prompt
		key         string
		calls       int // sent at once
		wantCharges int
		wantErr     error
	}{
		{name: "one key, sent twice", given: "a cat", key: "task-1:0", calls: 2, wantCharges: 1},
		{name: "one key, sent by 8 at once", given: "a cat", key: "task-2:0", calls: 8, wantCharges: 1},
		{name: "no key, sent twice", given: "a cat", key: "", calls: 2, wantCharges: 2},
		{name: "a refusal answers the same under its key", given: "a cat #fail", key: "task-3:0", calls: 2, wantCharges: 1,
			wantErr: errUpstreamRefused},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ref := "ref-" + strconv.Itoa(i)
			p := imageParams{Prompt: tt.given, AspectRatio: "1:1", N: 2}
			want, _ := answerOf(callOK, p, 0)
			var wg sync.WaitGroup
			for range tt.calls {
				wg.Go(func() {
					got, err := up.call(ctx, ref, tt.key, p, 0)
					if !errors.Is(err, tt.wantErr) || (err == nil && (len(got) != 2 || !bytes.Equal(got[1], want[1]))) {
						t.Errorf("call: %d images, %v; want the job's 2 images or %v", len(got), err, tt.wantErr)
					}
				})
			}
			wg.Wait()
			calls, err := up.calls(ctx, ref)
			if err != nil {
				t.Fatal(err)
			}
			charges, err := up.charges(ctx, ref)
			if err != nil {
				t.Fatal(err)
			}
			if calls != tt.calls || charges != tt.wantCharges {
				t.Errorf("%d requests received, %d charged; want %d and %d", calls, charges, tt.calls, tt.wantCharges)
			}
		})
	}
}

// A worker killed mid-call leaves its upstream request running; the
// task's next attempt (on another worker, under the retry policy) sends
// the same idempotency key, joins that request, and the task is charged
// once, with two requests received.
func TestKilledWorkerIsChargedOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and kills a worker process")
	}
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.PostgresDSN(t)
	pool, store := opsbench.Migrated(t, dsn)
	// A long call to kill in the middle of; a short lease, so the next
	// worker takes the task over soon; a lost attempt retried, not
	// reconciled.
	env := func(name string) []string {
		return []string{"DATABASE_URL=" + dsn, "GEN_TIME=4s", "TASK_LEASE=1s", "TASK_POLICY=images=retry",
			"WORKERS=1", "WORKER_NAME=" + name, "ADMIN_ADDR=off"}
	}
	first := startProc(t, env("first"), "worker")
	task, err := store.Submit(ctx, pgstore.NewTask{Tenant: "acme", Owner: "alice", Kind: kindImages,
		Runtime: taskRuntime, Network: taskNetwork, IdempotencyKey: "killed-mid-call", Fingerprint: "v1:fp",
		Params: json.RawMessage(`{"prompt":"a lighthouse","aspect_ratio":"1:1","n":2}`)})
	if err != nil {
		t.Fatal(err)
	}
	up := upstream{log: pool}
	wait.For(t, time.Minute, "the first worker's call at the upstream", func() bool {
		n, _ := up.calls(ctx, task.ID)
		return n == 1
	})
	if err := first.Kill(); err != nil {
		t.Fatal(err)
	}
	startProc(t, env("second"), "worker")
	var got pgstore.Task
	wait.For(t, 2*time.Minute, "the task to succeed on the second worker", func() bool {
		got, err = store.Get(ctx, "acme", "alice", task.ID)
		return err == nil && got.State == pgstore.StateSucceeded
	})
	calls, err := up.calls(ctx, task.ID)
	if err != nil {
		t.Fatal(err)
	}
	charges, err := up.charges(ctx, task.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Attempt < 2 || calls != 2 || charges != 1 || len(got.Results) != 2 {
		t.Errorf("attempt %d, %d requests received, %d charged, %d images; want attempt ≥ 2, 2 requests, 1 charge, 2 images",
			got.Attempt, calls, charges, len(got.Results))
	}
}
