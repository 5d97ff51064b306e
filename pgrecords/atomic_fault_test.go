package pgrecords_test

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/proctest"
	"github.com/idemgate/idemgate/internal/proxy"
	"github.com/idemgate/idemgate/internal/wait"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
)

// poolVia opens a pool on dsn whose connections go through a proxy that
// the test can freeze, partitioning the pool's node from the database;
// edits change the pool's config.
func poolVia(t *testing.T, dsn string, edits ...func(*pgxpool.Config)) (*pgxpool.Pool, *proxy.Proxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	px, err := proxy.Start(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	host, port, _ := net.SplitHostPort(px.Addr)
	p, _ := strconv.ParseUint(port, 10, 16)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = host, uint16(p), nil
	for _, edit := range edits {
		edit(cfg)
	}
	pool, err := pgxpool.NewWithConfig(testCtx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, px
}

// TestAtomicPartitionedNode: node A is cut off from Postgres (its link
// frozen) in the middle of its handler; its lease runs out, node B takes
// the key over and commits; when the link heals A's handler finishes its
// write, but its commit finds the claim gone and rolls back. One committed
// run, B's, and A's client gets 503 lease_lost.
func TestAtomicPartitionedNode(t *testing.T) {
	t.Parallel()
	pool, s := atomicDB(t)
	poolA, px := poolVia(t, pool.Config().ConnString())
	storeA, err := pgrecords.New(testCtx(t), poolA)
	if err != nil {
		t.Fatal(err)
	}
	a := newAtomicNode(t, "a", storeA, func(c *middleware.Config) { c.Lease = time.Second })
	b := newAtomicNode(t, "b", s, nil)
	done := make(chan int)
	var body string
	go func() {
		rec := a.send("partition", "late")
		body = rec.Body.String()
		done <- rec.Code
	}()
	<-a.entry
	px.Set(proxy.Freeze, 0)
	close(a.gate) // A writes into the frozen link
	var took string
	wait.For(t, time.Minute, "node B takes the key over", func() bool {
		rec := b.send("partition", "ok")
		took = rec.Body.String()
		return rec.Code == http.StatusCreated
	})
	px.Heal()
	if code := <-done; code != http.StatusServiceUnavailable || !strings.Contains(body, `"code":"lease_lost"`) {
		t.Errorf("node A answered %d %s, want 503 lease_lost", code, body)
	}
	var nodes []string
	rows, err := pool.Query(testCtx(t), `SELECT node FROM ledger WHERE key = 'partition'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		rows.Scan(&n)
		nodes = append(nodes, n)
	}
	if fmt.Sprint(nodes) != "[b]" {
		t.Errorf("committed runs by %v, want only node B's", nodes)
	}
	if rec := b.send("partition", "ok"); rec.Header().Get("Idempotent-Replayed") != "true" || rec.Body.String() != took {
		t.Errorf("retry = %d %s, want B's answer replayed", rec.Code, rec.Body)
	}
}

// nodeEnv names the database of the API node process that the kill tests
// start (this test binary again, running TestAtomicNodeProcess).
const nodeEnv = "PGRECORDS_ATOMIC_NODE_DSN"

// TestAtomicNodeProcess is the API node of the kill tests, not a test:
// it serves the Atomic export route on the database nodeEnv names, prints
// "ADDR host:port" and, when a handler of X-Mode "wait" has written its
// row, "WROTE", and runs until it is killed.
func TestAtomicNodeProcess(t *testing.T) {
	dsn := os.Getenv(nodeEnv)
	if dsn == "" {
		t.Skip("the API node process of TestAtomicKilledNode")
	}
	pool, err := pgxpool.New(testCtx(t), dsn)
	if err != nil {
		t.Fatal(err)
	}
	s, err := pgrecords.New(testCtx(t), pool)
	if err != nil {
		t.Fatal(err)
	}
	n := newAtomicNode(t, "killed", s, func(c *middleware.Config) { c.Lease = 2 * time.Second })
	go func() {
		for range n.entry {
			fmt.Println("WROTE")
		}
	}()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("ADDR", l.Addr())
	http.Serve(l, n.e)
}

// nodeAddr and nodeWrote are the lines the API node process prints once
// it serves and once a handler of X-Mode "wait" has written its row.
var (
	nodeAddr  = regexp.MustCompile(`^ADDR (\S+)$`)
	nodeWrote = regexp.MustCompile(`^WROTE$`)
)

// startNode starts the API node process on dsn (through proctest: it dies
// with the test binary, and the test's cleanup stops it, logging its
// output if the test failed) and returns it and its address.
func startNode(t *testing.T, dsn string) (*proctest.Process, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestAtomicNodeProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), nodeEnv+"="+dsn)
	p, err := proctest.Start(t, cmd)
	if err != nil {
		t.Fatal(err)
	}
	m, err := p.WaitOutput(nodeAddr, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return p, m[1]
}

// rawRequest sends the export request of key in mode on a connection of
// its own and returns the connection, to read the answer from.
func rawRequest(t *testing.T, addr, key, mode string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	body := `{"report":"q3"}`
	fmt.Fprintf(c, "POST /v1/export HTTP/1.1\r\nHost: node\r\nContent-Type: application/json\r\nIdempotency-Key: %s\r\nX-Mode: %s\r\nContent-Length: %d\r\n\r\n%s", key, mode, len(body), body)
	return c
}

// TestAtomicKilledNode: an API node killed (SIGKILL) in the middle of its
// handler, after its write, leaves nothing: the write is gone, and once
// the lease runs out the retry runs and commits once. One killed as the
// first byte of its answer goes out has committed: the retry replays.
func TestAtomicKilledNode(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a process")
	}
	pool, s := atomicDB(t)
	dsn := pool.Config().ConnString()
	other := newAtomicNode(t, "other", s, nil)

	t.Run("mid-handler", func(t *testing.T) {
		node, addr := startNode(t, dsn)
		rawRequest(t, addr, "killed-mid", "wait")
		if _, err := node.WaitOutput(nodeWrote, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := node.Kill(); err != nil {
			t.Fatal(err)
		}
		wait.For(t, 2*time.Minute, "the retry runs once the killed node's lease ran out", func() bool {
			return other.send("killed-mid", "ok").Code == http.StatusCreated
		})
		if got := ledgerRows(t, pool, "killed-mid"); got != 1 {
			t.Errorf("ledger rows = %d, want 1: the retry's (the killed run left nothing)", got)
		}
		if n := other.runs.Load(); n < 1 {
			t.Errorf("the retry did not run")
		}
	})

	t.Run("first byte out", func(t *testing.T) {
		node, addr := startNode(t, dsn)
		c := rawRequest(t, addr, "killed-answering", "ok")
		c.SetReadDeadline(time.Now().Add(time.Minute))
		if _, err := c.Read(make([]byte, 1)); err != nil {
			t.Fatalf("first byte: %v", err)
		}
		if err := node.Kill(); err != nil {
			t.Fatal(err)
		}
		runs := other.runs.Load()
		rec := other.send("killed-answering", "ok")
		if rec.Code != http.StatusCreated || rec.Header().Get("Idempotent-Replayed") != "true" || other.runs.Load() != runs {
			t.Errorf("retry = %d replayed=%q %s, want the killed node's committed answer replayed", rec.Code, rec.Header().Get("Idempotent-Replayed"), rec.Body)
		}
		if got := ledgerRows(t, pool, "killed-answering"); got != 1 {
			t.Errorf("ledger rows = %d, want 1", got)
		}
	})
}
