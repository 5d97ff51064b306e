package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/internal/proctest"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/keyspace"
)

func TestMain(m *testing.M) {
	code := testenv.Main(m)
	proctest.Cleanup()
	os.Exit(code)
}

// examplePkg is this program, built for the tests that run it as a process.
const examplePkg = "github.com/idemgate/idemgate/example"

// proc is one running example process and, for serve, its URL.
type proc struct {
	*proctest.Process
	url string
}

// lockedBuffer is a bytes.Buffer safe for a writer and readers in
// different goroutines (TestExampleTelemetry's span exporter writes to one).
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// upRE matches the line that says a process is up: "listening on URL" for
// serve, "worker NAME running" for worker.
var upRE = regexp.MustCompile(`listening on (http://\S+)|example worker (?:\S+ )?running`)

// startProc runs the example binary with env (nothing else of ours leaks
// in) and waits until its stdout says it is up. The process is stopped at
// cleanup.
func startProc(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p, err := launch(t, proctest.Build(t, examplePkg), env, args...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// launch is startProc for any goroutine: it reports failure as an error.
func launch(t *testing.T, bin string, env []string, args ...string) (*proc, error) {
	cmd := exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "DATABASE_URL", "REDIS_URL", "JWT_SECRET", "ADDR", "WORKERS", "GEN_TIME", "DEMO_URL":
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	cmd.Env = append(cmd.Env, env...)
	p, err := proctest.Start(t, cmd)
	if err != nil {
		return nil, err
	}
	m, err := p.WaitOutput(upRE, 90*time.Second)
	if err != nil {
		return nil, err
	}
	return &proc{Process: p, url: m[1]}, nil
}

// testSecret signs the tokens of the end-to-end tests.
const testSecret = "e2e-test-secret"

func token(t *testing.T, tenant, user string) string {
	t.Helper()
	tok, err := mintToken([]byte(testSecret), tenant, user, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// deployment is two serve nodes and one worker process on one Redis and
// one Postgres.
type deployment struct {
	a, b    *proc
	dsn     string
	redis   *redis.Client
	ownsRDB bool // the Redis server is this test binary's own
}

func startDeployment(t *testing.T) *deployment {
	t.Helper()
	dsn := testenv.PostgresDSN(t)
	ropts := testenv.Redis(t)
	redisURL := fmt.Sprintf("redis://%s/%d", ropts.Addr, ropts.DB)
	if ropts.Password != "" {
		redisURL = fmt.Sprintf("redis://:%s@%s/%d", ropts.Password, ropts.Addr, ropts.DB)
	}
	env := []string{"DATABASE_URL=" + dsn, "REDIS_URL=" + redisURL, "JWT_SECRET=" + testSecret, "GEN_TIME=300ms"}
	d := &deployment{dsn: dsn, redis: redis.NewClient(ropts), ownsRDB: testenv.RedisServer(t) != nil}
	t.Cleanup(func() { d.redis.Close() })
	// Start the nodes at once: their migrations race, as in a rollout.
	bin := proctest.Build(t, examplePkg)
	names := []string{"a", "b", "worker"}
	procs := make([]*proc, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			args := []string{"serve", "-addr", "127.0.0.1:0", "-workers", "1"}
			if name == "worker" {
				args = []string{"worker", "-workers", "2"}
			}
			procs[i], errs[i] = launch(t, bin, env, args...)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	d.a, d.b = procs[0], procs[1]
	return d
}

// call is one HTTP request's answer.
type call struct {
	status int
	header http.Header
	body   []byte
}

func (c call) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(c.body, &m); err != nil {
		t.Fatalf("answer %d is not JSON: %v\n%s", c.status, err, c.body)
	}
	return m
}

func do(t *testing.T, method, url, tok, key, body string) call {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return call{status: resp.StatusCode, header: resp.Header, body: b}
}

// rowsForKey counts task rows holding the idempotency key of (tenant,
// user, request id, kind), straight from Postgres.
func rowsForKey(t *testing.T, dsn, tenant, user, request, kind string) (int, []string) {
	t.Helper()
	k, err := keyspace.Derive(kind, keyspace.Scope{Tenant: tenant, User: user, Request: request})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, _ := conn.Query(ctx, "SELECT id::text FROM idemgate_tasks WHERE idempotency_key = $1", k.Task())
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return len(ids), ids
}
