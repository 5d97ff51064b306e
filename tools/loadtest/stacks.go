package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/pgtrace"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/pgstore"
	"github.com/idemgate/idemgate/redisstore"
)

const (
	// floorName is the plain-command floor (the physical limit: SET NX
	// PX GET then SET for a miss, that one SET NX GET finding the record
	// for a replay or a conflict); floorScriptName does the same claim
	// with a Lua script, as idemgate did before records v2.
	floorName       = "floor"
	floorScriptName = "floor-script"
	// tasksTable holds every stack's tasks (pgstore's table); each
	// scenario and stack has a tenant of its own.
	tasksTable   = "idemgate_tasks"
	tasksKeyCol  = "idempotency_key"
	idemgateName = "idemgate"
	// slowHeader asks each stack's handler to take this long (dup scenario).
	slowHeader = "X-Loadtest-Slow"
	retention  = time.Hour
	lease      = 30 * time.Second
	maxBody    = 1 << 20
	// The example service's runtime and network columns.
	taskRuntime = "standin-v1"
	taskNetwork = "local"
)

// imageRequest is the body of POST /v1/images, as in the example service.
type imageRequest struct {
	Prompt         string `json:"prompt"`
	AspectRatio    string `json:"aspect_ratio"`
	N              int    `json:"n"`
	ReferenceImage string `json:"reference_image,omitempty"`
	ClientNote     string `json:"client_note,omitempty"`
}

func (r imageRequest) validate() error {
	switch {
	case r.Prompt == "":
		return errors.New("prompt is required")
	case r.N < 1 || r.N > 4:
		return errors.New("n must be between 1 and 4")
	}
	switch r.AspectRatio {
	case "1:1", "16:9", "9:16", "4:3", "3:4":
		return nil
	}
	return errors.New("aspect_ratio must be one of 1:1, 16:9, 9:16, 4:3, 3:4")
}

type accepted struct {
	TaskID      string `json:"task_id"`
	Status      string `json:"status"`
	PollAfterMS int64  `json:"poll_after_ms"`
}

// stack is one server under test.
type stack struct {
	name   string
	floor  string // the floor its ratio is to; "" for a floor
	url    string
	table  string              // where its rows go
	keyCol string              // table's column of the key a row was written for
	rt     *roundTrips         // Redis round trips
	pgrt   *pgtrace.RoundTrips // Postgres round trips of its records pool; nil without one
	execs  *executions
	close  func()
}

// executions counts handler runs per key and rows created.
type executions struct {
	mu      sync.Mutex
	perKey  map[string]int
	total   atomic.Int64
	created atomic.Int64 // rows newly inserted (pgstore: Duplicate == false; each ledger row)
}

func newExecutions() *executions { return &executions{perKey: map[string]int{}} }

func (x *executions) ran(key string) {
	x.total.Add(1)
	x.mu.Lock()
	x.perKey[key]++
	x.mu.Unlock()
}

// reset starts a new scenario and returns the previous counts.
func (x *executions) reset() (total, created, duplicates int64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, n := range x.perKey {
		if n > 1 {
			duplicates += int64(n - 1)
		}
	}
	x.perKey = map[string]int{}
	return x.total.Swap(0), x.created.Swap(0), duplicates
}

// slowdown sleeps for the slowHeader's duration, as a slow handler would.
func slowdown(r *http.Request) {
	d, err := time.ParseDuration(r.Header.Get(slowHeader))
	if err != nil || d <= 0 {
		return
	}
	select {
	case <-time.After(d):
	case <-r.Context().Done():
	}
}

func serve(e *echo.Echo) (url string, stop func(), err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: e, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l)
	return "http://" + l.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}, nil
}

func newEcho() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	return e
}

// ---- idemgate ----

// newIdemgate serves echo + the idempotency middleware on a RedisStore + a
// handler that submits a pgstore task, like the example's POST /v1/images.
func newIdemgate(ctx context.Context, e *env, o options) (*stack, error) {
	tasks, err := e.taskStore(ctx, o)
	if err != nil {
		return nil, err
	}
	st := &stack{name: idemgateName, floor: floorName, table: tasksTable, keyCol: tasksKeyCol, rt: &roundTrips{}, execs: newExecutions()}
	rdb := e.newRedis(2*o.concurrency, st.rt)
	if err := serveMiddleware(st, redisstore.New(rdb), &idemHandler{tasks: tasks, execs: st.execs}, false); err != nil {
		return nil, err
	}
	return st, nil
}

// serveMiddleware serves st: echo + the idempotency middleware on records
// + h. Every idemgate stack uses it, so they differ only in the Store (and
// whether the route is Atomic).
func serveMiddleware(st *stack, records idemgate.Store, h *idemHandler, atomic bool) error {
	idem, err := middleware.Config{
		Store:       records,
		Scope:       headerScope,
		Kind:        "images",
		Fingerprint: fingerprint.Spec{Fields: []string{"/prompt", "/aspect_ratio", "/n", "/reference_image"}},
		Required:    true,
		Retention:   retention,
		Lease:       lease,
		Atomic:      atomic,
	}.ToMiddleware()
	if err != nil {
		return fmt.Errorf("middleware: %w", err)
	}
	ec := newEcho()
	ec.POST("/v1/images", h.submit, idem)
	st.url, st.close, err = serve(ec)
	return err
}

func headerScope(c echo.Context) (tenant, user string, err error) {
	tenant, user = c.Request().Header.Get("X-Tenant"), c.Request().Header.Get("X-User")
	if tenant == "" || user == "" {
		return "", "", echo.ErrUnauthorized
	}
	return tenant, user, nil
}

// idemHandler is the idemgate stacks' handler: it decodes and validates
// the body, then submits a task to tasks, or with ledger set (-pg-write
// ledger) writes one ledger row through the ledger pool (or the Atomic
// route's transaction) instead.
type idemHandler struct {
	tasks  *pgstore.Store
	ledger *pgxpool.Pool
	execs  *executions
}

func (h *idemHandler) submit(c echo.Context) error {
	req, ok := middleware.FromContext(c)
	if !ok {
		return echo.NewHTTPError(http.StatusInternalServerError, "idempotency middleware missing")
	}
	h.execs.ran(req.Key.String())
	body, err := io.ReadAll(io.LimitReader(c.Request().Body, maxBody))
	if err != nil {
		return err
	}
	var in imageRequest
	if err := json.Unmarshal(body, &in); err != nil {
		return echo.NewHTTPError(http.StatusBadRequest, "body: "+err.Error())
	}
	if err := in.validate(); err != nil {
		return echo.NewHTTPError(http.StatusBadRequest, err.Error())
	}
	slowdown(c.Request())
	if h.ledger != nil {
		return h.record(c, req, in)
	}
	submit := h.tasks.Submit
	if tx, ok := pgrecords.TxFromContext(c.Request().Context()); ok { // an Atomic route: the task commits with the answer
		submit = func(ctx context.Context, t pgstore.NewTask) (pgstore.Task, error) {
			return h.tasks.SubmitTx(ctx, tx, t)
		}
	}
	task, err := submit(c.Request().Context(), pgstore.NewTask{
		Tenant:         req.Key.Tenant(),
		Owner:          req.Key.Owner(),
		Kind:           req.Key.Kind(),
		Runtime:        taskRuntime,
		Network:        taskNetwork,
		IdempotencyKey: req.Key.Task(),
		Fingerprint:    string(req.Fingerprint),
		Params:         body,
	})
	if errors.Is(err, pgstore.ErrConflict) {
		return idemgate.ErrKeyReused
	}
	if err != nil {
		return err
	}
	if !task.Duplicate {
		h.execs.created.Add(1)
	}
	return acceptedResponse(c, task.ID, string(task.State))
}

// record writes the request's ledger row with one INSERT: in the route's
// transaction on an Atomic route (it commits with the stored answer),
// else in autocommit on the ledger pool. It answers like submit: 202, the
// entry's id as task_id (a replay must give the same), Location and
// Retry-After.
func (h *idemHandler) record(c echo.Context, req middleware.Request, in imageRequest) error {
	var db interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	} = h.ledger
	if tx, ok := pgrecords.TxFromContext(c.Request().Context()); ok {
		db = tx
	}
	var id [16]byte
	rand.Read(id[:])
	id[6], id[8] = id[6]&0x0f|0x40, id[8]&0x3f|0x80 // a version 4 UUID
	if _, err := db.Exec(c.Request().Context(), sqlLedgerInsert,
		req.Key.String(), req.Key.Tenant(), id, int64(in.N)*100); err != nil {
		return err
	}
	h.execs.created.Add(1)
	h32 := hex.EncodeToString(id[:])
	entry := h32[:8] + "-" + h32[8:12] + "-" + h32[12:16] + "-" + h32[16:20] + "-" + h32[20:]
	c.Response().Header().Set("Location", "/v1/ledger/"+entry)
	c.Response().Header().Set("Retry-After", "1")
	return c.JSON(http.StatusAccepted, accepted{TaskID: entry, Status: "recorded", PollAfterMS: 1000})
}

func acceptedResponse(c echo.Context, id, state string) error {
	c.Response().Header().Set("Location", "/v1/tasks/"+id)
	c.Response().Header().Set("Retry-After", "1")
	return c.JSON(http.StatusAccepted, accepted{TaskID: id, Status: state, PollAfterMS: 1000})
}

// ---- floor ----

// floorClaim reads the record or claims the key, in one round trip.
var floorClaimScript = `
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false`

// newFloor serves a floor: a bare echo handler that does by hand, with the
// fewest steps, what the idempotency middleware does (plain: one SET NX PX
// GET to claim or read, one SET of the response; scripted: the claim by a
// Lua script instead), around the same task work as the idemgate stack's
// handler: the same JSON decode and validation, and the same
// pgstore.Submit of the same NewTask (same columns, same sizes), on a
// pgstore.Store of its own with a pool of its own. So every stack differs
// only in its idempotency layer.
func newFloor(ctx context.Context, e *env, o options, plain bool) (*stack, error) {
	store, err := e.taskStore(ctx, o)
	if err != nil {
		return nil, err
	}
	name := floorScriptName
	if plain {
		name = floorName
	}
	st := &stack{name: name, table: tasksTable, keyCol: tasksKeyCol, rt: &roundTrips{}, execs: newExecutions()}
	if !plain {
		st.floor = floorName
	}
	f := &floor{
		plain: plain,
		rdb:   e.newRedis(2*o.concurrency, st.rt),
		claim: redis.NewScript(floorClaimScript),
		store: store,
		execs: st.execs,
	}
	ec := newEcho()
	ec.POST("/v1/images", f.submit)
	if st.url, st.close, err = serve(ec); err != nil {
		return nil, err
	}
	return st, nil
}

// floorRequest reads what every floor handler needs from a request: the
// scope from the headers, the Idempotency-Key and the body (at most
// maxBody bytes).
func floorRequest(c echo.Context) (tenant, user, reqID string, body []byte, err error) {
	r := c.Request()
	if tenant, user, err = headerScope(c); err != nil {
		return
	}
	if reqID = r.Header.Get("Idempotency-Key"); reqID == "" {
		err = echo.NewHTTPError(http.StatusBadRequest, "Idempotency-Key required")
		return
	}
	if body, err = io.ReadAll(io.LimitReader(r.Body, maxBody+1)); err != nil {
		return
	}
	if len(body) > maxBody {
		err = echo.NewHTTPError(http.StatusRequestEntityTooLarge)
	}
	return
}

type floor struct {
	plain bool
	rdb   redis.UniversalClient
	claim *redis.Script
	store *pgstore.Store
	execs *executions
}

func (f *floor) submit(c echo.Context) error {
	r := c.Request()
	ctx := r.Context()
	tenant, user, reqID, body, err := floorRequest(c)
	if err != nil {
		return err
	}
	fp := sha256.Sum256(body)
	fpHex := hex.EncodeToString(fp[:])
	key := "floor:" + tenant + ":" + user + ":" + reqID

	var v string
	if f.plain {
		v, err = f.rdb.SetArgs(ctx, key, "p"+fpHex, redis.SetArgs{Mode: "NX", TTL: lease, Get: true}).Result()
	} else {
		v, err = f.claim.Run(ctx, f.rdb, []string{key}, "p"+fpHex, lease.Milliseconds()).Text()
	}
	switch {
	case errors.Is(err, redis.Nil): // claimed
	case err != nil:
		return echo.NewHTTPError(http.StatusServiceUnavailable, "store unavailable")
	case len(v) < 1+64 || v[1:65] != fpHex:
		return echo.NewHTTPError(http.StatusConflict, "key reused with other parameters")
	case v[0] == 'p':
		c.Response().Header().Set("Retry-After", "1")
		return echo.NewHTTPError(http.StatusConflict, "request in progress")
	default: // "c" + fingerprint + 3-digit status + body
		status, _ := strconv.Atoi(v[65:68])
		c.Response().Header().Set("Idempotent-Replayed", "true")
		return c.Blob(status, echo.MIMEApplicationJSON, []byte(v[68:]))
	}

	f.execs.ran(key)
	var in imageRequest
	err = json.Unmarshal(body, &in)
	if err == nil {
		err = in.validate()
	}
	if err != nil {
		f.rdb.Del(context.WithoutCancel(ctx), key)
		return echo.NewHTTPError(http.StatusBadRequest, err.Error())
	}
	slowdown(r)
	userSum := sha256.Sum256([]byte(user))
	task, err := f.store.Submit(ctx, floorTask(tenant, hex.EncodeToString(userSum[:]), key, "v1:"+fpHex, body))
	if err != nil {
		f.rdb.Del(context.WithoutCancel(ctx), key)
		if errors.Is(err, pgstore.ErrConflict) {
			return echo.NewHTTPError(http.StatusConflict, "key reused with other parameters")
		}
		return err
	}
	id, state := task.ID, string(task.State)
	if !task.Duplicate {
		f.execs.created.Add(1)
	}
	out, _ := json.Marshal(accepted{TaskID: id, Status: state, PollAfterMS: 1000})
	if err := f.rdb.Set(context.WithoutCancel(ctx), key, "c"+fpHex+"202"+string(out), retention).Err(); err != nil {
		return echo.NewHTTPError(http.StatusServiceUnavailable, "store unavailable")
	}
	c.Response().Header().Set("Location", "/v1/tasks/"+id)
	c.Response().Header().Set("Retry-After", "1")
	return c.JSONBlob(http.StatusAccepted, out)
}

// floorTask is the task a floor submits for key: the same as the idemgate
// stacks' handler submits, column for column and size for size: keyspace's
// owner (hex SHA-256 of the user), a task key of kind + hex SHA-256, a
// "v1:" + hex fingerprint, the body as params.
func floorTask(tenant, owner, key, fp string, body []byte) pgstore.NewTask {
	keySum := sha256.Sum256([]byte(key))
	return pgstore.NewTask{
		Tenant:         tenant,
		Owner:          owner,
		Kind:           "images",
		Runtime:        taskRuntime,
		Network:        taskNetwork,
		IdempotencyKey: "images:" + hex.EncodeToString(keySum[:]),
		Fingerprint:    fp,
		Params:         body,
	}
}
