package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/keyspace"
)

func TestMain(m *testing.M) {
	code := testenv.Main(m)
	if builtDir != "" {
		os.RemoveAll(builtDir)
	}
	os.Exit(code)
}

// The example binary, built once per test binary (with -race when the
// tests run with it).
var (
	buildOnce sync.Once
	builtDir  string
	builtBin  string
	buildErr  error
)

func exampleBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		builtDir, buildErr = os.MkdirTemp("", "idemgate-example-bin-")
		if buildErr != nil {
			return
		}
		builtBin = filepath.Join(builtDir, "example")
		args := []string{"build", "-o", builtBin}
		if raceEnabled {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// proc is one running example process.
type proc struct {
	cmd  *exec.Cmd
	out  *lockedBuffer
	url  string
	done chan struct{}
	err  error
}

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

var listeningRE = regexp.MustCompile(`listening on (http://\S+)`)

// startProc runs the example binary with env (nothing else of ours leaks
// in) and waits until its stdout says it is up: "listening on URL" for
// serve, "worker running" for worker. The process is killed at cleanup.
func startProc(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p, err := launch(t, exampleBinary(t), env, args...)
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
	p := &proc{cmd: cmd, out: &lockedBuffer{}, done: make(chan struct{})}
	pr, pw := io.Pipe()
	cmd.Stdout = io.MultiWriter(p.out, pw)
	cmd.Stderr = p.out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %v: %v", args, err)
	}
	go func() {
		p.err = cmd.Wait()
		pw.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("output of %v:\n%s", args, p.out.String())
		}
	})
	up := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			if m := listeningRE.FindStringSubmatch(line); m != nil {
				up <- m[1]
			} else if strings.Contains(line, "worker running") {
				up <- ""
			}
		}
		io.Copy(io.Discard, pr)
	}()
	select {
	case p.url = <-up:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("%v exited before it was up: %v\n%s", args, p.err, p.out.String())
	case <-time.After(90 * time.Second):
		return nil, fmt.Errorf("%v not up after 90s:\n%s", args, p.out.String())
	}
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
	bin := exampleBinary(t)
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
