//go:build faults

package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/proctest"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgstore"
	"github.com/idemgate/idemgate/redisstore"
)

func TestMain(m *testing.M) {
	// Killed servers make go-redis log every failed dial; the assertions
	// say what matters.
	redis.SetLogger(quietLogger{})
	code := testenv.Main(m)
	proctest.Cleanup()
	os.Exit(code)
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// The example service's task columns, as its POST /v1/images writes them.
const (
	taskRuntime = "standin-v1"
	taskNetwork = "local"
)

// ---- an in-process API node: echo + middleware + pgstore ----

// node is one in-process API node serving POST /v1/images like the example
// service: the idempotency middleware on a redisstore.Store, then a handler that
// submits a pgstore task. It counts what its handler did per key.
type node struct {
	url string

	mu        sync.Mutex
	runs      map[string]int // handler runs per request id
	created   map[string]int // tasks newly created (Submit Duplicate == false) per request id
	readBacks int            // Submits that found their key's task in Postgres
}

type nodeConfig struct {
	redis *redis.Options
	pool  *pgxpool.Pool
	lease time.Duration
}

// startNode serves a node on loopback until the test ends.
func startNode(t *testing.T, cfg nodeConfig) *node {
	t.Helper()
	ctx := context.Background()
	store, err := pgstore.New(ctx, cfg.pool)
	if err != nil {
		t.Fatalf("pgstore.New: %v", err)
	}
	rdb := redis.NewClient(cfg.redis)
	t.Cleanup(func() { rdb.Close() })
	n := &node{runs: map[string]int{}, created: map[string]int{}}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = problemHandler
	e.POST("/v1/images", func(c echo.Context) error {
		req, ok := middleware.FromContext(c)
		if !ok {
			return errors.New("no idempotency key in context")
		}
		id := c.Request().Header.Get("Idempotency-Key")
		n.mu.Lock()
		n.runs[id]++
		n.mu.Unlock()
		body, err := io.ReadAll(c.Request().Body)
		if err != nil {
			return err
		}
		task, err := store.Submit(c.Request().Context(), pgstore.NewTask{
			Tenant: req.Key.Tenant(), Owner: req.Key.Owner(), Kind: req.Key.Kind(),
			Runtime: taskRuntime, Network: taskNetwork,
			IdempotencyKey: req.Key.Task(), Fingerprint: string(req.Fingerprint), Params: body,
		})
		if errors.Is(err, pgstore.ErrConflict) {
			return idemgate.ErrKeyReused
		}
		if err != nil {
			// As the example: Postgres down is a retryable 503.
			c.Response().Header().Set("Retry-After", "1")
			return errTaskStoreUnavailable
		}
		n.mu.Lock()
		if task.Duplicate {
			n.readBacks++
		} else {
			n.created[id]++
		}
		n.mu.Unlock()
		c.Response().Header().Set("Location", "/v1/tasks/"+task.ID)
		c.Response().Header().Set("Retry-After", "1")
		return c.JSON(http.StatusAccepted, map[string]any{"task_id": task.ID, "status": task.State, "poll_after_ms": 1000})
	}, middleware.New(middleware.Config{
		Store: redisstore.New(rdb),
		Scope: func(c echo.Context) (string, string, error) {
			return c.Request().Header.Get("X-Tenant"), c.Request().Header.Get("X-User"), nil
		},
		Kind:        "images",
		Fingerprint: fingerprint.Spec{Fields: []string{"/prompt", "/aspect_ratio", "/n", "/reference_image"}},
		Required:    true,
		Lease:       cfg.lease,
	}))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: e}
	go srv.Serve(l)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	n.url = "http://" + l.Addr().String()
	return n
}

// errTaskStoreUnavailable is the handler's answer when Submit fails for
// any reason but a conflict, as in the example service.
var errTaskStoreUnavailable = errors.New("task store unavailable")

// problemHandler answers handler errors as the example service does: a
// problem document, 503 "task_store_unavailable" when Postgres failed,
// 500 "internal" for an unexpected error.
func problemHandler(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	status, code := http.StatusInternalServerError, "internal"
	var he *echo.HTTPError
	switch {
	case errors.Is(err, errTaskStoreUnavailable):
		status, code = http.StatusServiceUnavailable, "task_store_unavailable"
	case errors.As(err, &he):
		status, code = he.Code, "http_"+strconv.Itoa(he.Code)
	}
	b, _ := json.Marshal(map[string]any{"type": "about:blank", "title": http.StatusText(status), "status": status, "code": code})
	c.Blob(status, "application/problem+json", b)
}

// checkRuns asserts that no key's handler created a task twice, and logs
// how many handler runs were repeats (after a failed attempt whose claim was
// released, or after Redis forgot the key) and how many of those found
// their task in Postgres (a read-back creates nothing: not a duplicate
// execution). It returns the read-backs.
func (n *node) checkRuns(t *testing.T) (readBacks int) {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	for id, c := range n.created {
		if c > 1 {
			t.Errorf("duplicate execution: key %s created %d tasks", id, c)
		}
	}
	repeats := 0
	for _, r := range n.runs {
		if r > 1 {
			repeats += r - 1
		}
	}
	t.Logf("handler runs: %d repeated a key, %d found its task in Postgres (read back, nothing created)", repeats, n.readBacks)
	return n.readBacks
}

// ---- clients that follow the rules ----

// reply is one answer a client saw.
type reply struct {
	at         time.Time
	key        string
	target     string // the base URL it was sent to
	status     int    // 0: transport error
	err        string
	code       string // the problem's "code"
	problem    bool   // Content-Type application/problem+json
	retryAfter string
	taskID     string
	latency    time.Duration
}

func (r reply) String() string {
	if r.status == 0 {
		return "transport error: " + r.err
	}
	return fmt.Sprintf("%d %s (problem=%v, Retry-After=%q, %v)", r.status, r.code, r.problem, r.retryAfter, r.latency.Round(time.Millisecond))
}

// target is where a client sends a request.
type target struct {
	url     string
	headers http.Header // auth (bearer token or X-Tenant/X-User)
}

// load runs clients that each submit one business action after another:
// the same request id and body until the answer is a 2xx (retrying 409
// in-progress, 5xx and transport errors with backoff, round-robin over the
// targets), then a new one. Stop ends new actions; the current ones are
// retried to an answer ("drained").
type load struct {
	t       *testing.T
	targets func(attempt int) target
	clients int
	prefix  string
	http    *http.Client

	stopping atomic.Bool
	aborted  atomic.Bool // the test is over: no draining
	wg       sync.WaitGroup
	mu       sync.Mutex
	replies  []reply
	keys     map[string]string // key → task id of its first 2xx ("" until accepted)
	inFlight map[string]int    // base URL → attempts sent there and not yet answered
}

func startLoad(t *testing.T, clients int, prefix string, targets func(attempt int) target) *load {
	t.Helper()
	l := &load{
		t: t, targets: targets, clients: clients, prefix: prefix, keys: map[string]string{}, inFlight: map[string]int{},
		http: &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: clients}},
	}
	for c := 0; c < clients; c++ {
		l.wg.Add(1)
		go l.client(c)
	}
	t.Cleanup(func() { l.aborted.Store(true); l.stopping.Store(true); l.wg.Wait() })
	return l
}

var imageBody = []byte(`{"prompt":"a lighthouse at dusk","aspect_ratio":"16:9","n":1}`)

func (l *load) client(c int) {
	defer l.wg.Done()
	deadline := time.Time{}
	for seq := 0; !l.stopping.Load(); seq++ {
		key := fmt.Sprintf("%s-%d-%d", l.prefix, c, seq)
		l.mu.Lock()
		l.keys[key] = ""
		l.mu.Unlock()
		backoff := 10 * time.Millisecond
		for attempt := 0; ; attempt++ {
			tg := l.targets(attempt)
			l.mu.Lock()
			l.inFlight[tg.url]++
			l.mu.Unlock()
			r := send(context.Background(), l.http, tg, key, imageBody)
			l.record(r)
			if r.status/100 == 2 || r.code == string(idemgate.CodeKeyReused) || l.aborted.Load() {
				break
			}
			if l.stopping.Load() {
				if deadline.IsZero() {
					deadline = time.Now().Add(90 * time.Second)
				}
				if time.Now().After(deadline) {
					return // drained too long: the check reports the key as never accepted
				}
			}
			time.Sleep(backoff)
			backoff = min(2*backoff, 250*time.Millisecond)
		}
	}
}

func (l *load) record(r reply) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.replies = append(l.replies, r)
	l.inFlight[r.target]--
	if r.status/100 == 2 {
		if prev := l.keys[r.key]; prev == "" {
			l.keys[r.key] = r.taskID
		} else if prev != r.taskID {
			l.t.Errorf("key %s: answered with task %s, earlier with task %s", r.key, r.taskID, prev)
		}
	}
}

// stop ends the load: every started action is retried until answered.
func (l *load) stop() {
	l.stopping.Store(true)
	l.wg.Wait()
}

// since returns the replies seen after t0 (all, for the zero time).
func (l *load) since(t0 time.Time) []reply {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []reply
	for _, r := range l.replies {
		if !r.at.Before(t0) {
			out = append(out, r)
		}
	}
	return out
}

// inFlightTo returns the number of attempts sent to url and not yet
// answered.
func (l *load) inFlightTo(url string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inFlight[url]
}

// accepted returns the number of actions answered with a 2xx so far.
func (l *load) accepted() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, id := range l.keys {
		if id != "" {
			n++
		}
	}
	return n
}

// patience bounds a wait for the system to do something: it returns as
// soon as the thing is done, so it costs nothing when the system works,
// and it is long enough that a loaded machine (load 20, race-built
// binaries) does not fail a run that would pass on a quiet one. What
// a wait proves is that the thing happens, never how fast.
const patience = 2 * time.Minute

// waitAccepted waits until n more actions than now were accepted, with
// patience.
func (l *load) waitAccepted(t *testing.T, n int) {
	t.Helper()
	const within = patience
	goal := l.accepted() + n
	deadline := time.Now().Add(within)
	for l.accepted() < goal {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d actions accepted within %v; last replies: %v", l.accepted(), goal, within, tail(l.since(time.Time{}), 5))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tail(rs []reply, n int) []reply {
	if len(rs) > n {
		return rs[len(rs)-n:]
	}
	return rs
}

// send posts one image request and reads the answer.
func send(ctx context.Context, hc *http.Client, tg target, key string, body []byte) reply {
	start := time.Now()
	r := reply{at: start, key: key, target: tg.url}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, tg.url+"/v1/images", bytes.NewReader(body))
	if err != nil {
		r.err = err.Error()
		return r
	}
	for k, v := range tg.headers {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := hc.Do(req)
	r.latency = time.Since(start)
	if err != nil {
		r.err = err.Error()
		return r
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	r.latency = time.Since(start)
	if err != nil {
		r.err = err.Error()
		return r
	}
	r.status = resp.StatusCode
	r.problem = strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json")
	r.retryAfter = resp.Header.Get("Retry-After")
	var doc struct {
		Code   string `json:"code"`
		TaskID string `json:"task_id"`
	}
	_ = json.Unmarshal(b, &doc)
	r.code, r.taskID = doc.Code, doc.TaskID
	if r.status/100 == 2 && r.taskID == "" {
		r.err = "2xx without task_id: " + string(b)
	}
	return r
}

// ---- what every case asserts ----

// allowed says which non-2xx answers a case may see while its fault lasts.
type allowed func(r reply) bool

// clearError is what every case allows: the middleware's fail-closed 503
// and in-progress 409, both with Retry-After, as problem documents.
func clearError(r reply) bool {
	switch {
	case r.status == http.StatusServiceUnavailable && r.code == string(idemgate.CodeStoreUnavailable):
		return r.problem && r.retryAfter != ""
	case r.status == http.StatusConflict && r.code == string(idemgate.CodeRequestInProgress):
		return r.problem && r.retryAfter != ""
	}
	return false
}

// count returns how many replies match.
func count(rs []reply, match func(reply) bool) int {
	n := 0
	for _, r := range rs {
		if match(r) {
			n++
		}
	}
	return n
}

// checkReplies asserts every non-2xx reply is one the case allows, and
// that every 2xx names its task.
func checkReplies(t *testing.T, rs []reply, ok allowed) {
	t.Helper()
	bad := map[string]int{}
	var sample []reply
	for _, r := range rs {
		if r.status/100 == 2 {
			if r.err != "" {
				t.Errorf("key %s: %s", r.key, r.err)
			}
			continue
		}
		if r.code == string(idemgate.CodeKeyReused) {
			t.Errorf("key %s: 409 key_reused for a byte-identical retry", r.key)
			continue
		}
		if !clearError(r) && (ok == nil || !ok(r)) {
			bad[fmt.Sprintf("%d %s", r.status, r.code)]++
			if len(sample) < 5 {
				sample = append(sample, r)
			}
		}
	}
	if len(bad) > 0 {
		t.Errorf("unclear errors: %v; e.g. %v", bad, sample)
	}
}

// checkTasks asserts, against Postgres, that every action the clients
// started was accepted, that each accepted task exists with the ID the
// client was given (no lost task), and that no key has two tasks.
func checkTasks(t *testing.T, db *pgxpool.Pool, l *load, tenant string) {
	t.Helper()
	ctx := context.Background()
	rows, err := db.Query(ctx, `SELECT id::text, idempotency_key FROM idemgate_tasks WHERE tenant = $1`, tenant)
	if err != nil {
		t.Fatalf("read tasks: %v", err)
	}
	ids := map[string]bool{}
	perKey := map[string]int{}
	for rows.Next() {
		var id, key string
		if err := rows.Scan(&id, &key); err != nil {
			t.Fatal(err)
		}
		ids[id] = true
		perKey[key]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for key, n := range perKey {
		if n > 1 {
			t.Errorf("duplicate task: key %s has %d tasks", key, n)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	accepted := 0
	var never []string
	for key, id := range l.keys {
		switch {
		case id == "":
			never = append(never, key)
		case !ids[id]:
			t.Errorf("lost task: key %s was accepted as task %s, which is not in Postgres", key, id)
		default:
			accepted++
		}
	}
	sort.Strings(never)
	if len(never) > 0 {
		t.Errorf("%d actions never accepted after the fault healed: %v", len(never), never)
	}
	if len(ids) != accepted {
		t.Errorf("Postgres has %d tasks for %d accepted actions", len(ids), accepted)
	}
	if accepted == 0 {
		t.Errorf("no action was accepted: the load did not run")
	}
	t.Logf("%d actions accepted, %d tasks, %d replies", accepted, len(ids), len(l.replies))
}

// summary counts replies by status and code, for the logs.
func summary(rs []reply) string {
	m := map[string]int{}
	for _, r := range rs {
		k := strconv.Itoa(r.status)
		if r.status == 0 {
			k = "transport"
		} else if r.code != "" {
			k += " " + r.code
		}
		m[k]++
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s: %d", k, m[k])
	}
	return b.String()
}

// maxLatency returns the slowest reply.
func maxLatency(rs []reply) time.Duration {
	var m time.Duration
	for _, r := range rs {
		m = max(m, r.latency)
	}
	return m
}

// migratedPool opens a pool on a fresh database with the schema migrated.
func migratedPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(pool.Close)
	store, err := pgstore.New(ctx, pool)
	if err != nil {
		t.Fatalf("pgstore.New: %v", err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return pool
}

// headerTarget is a target for in-process nodes (tenant and user in headers).
func headerTarget(url, tenant string) target {
	return target{url: url, headers: http.Header{"X-Tenant": {tenant}, "X-User": {"user-1"}}}
}
