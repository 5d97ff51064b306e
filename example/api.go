package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/keyspace"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/pgstore"
	"github.com/idemgate/idemgate/redisstore"
)

// Task kinds. Each route has its own kind, so the same request id under
// /v1/images and /v1/music names two different actions: kinds never share keys.
const (
	kindImages = "images"
	kindMusic  = "music"
)

// Every task of this service runs on the stand-in generator in one
// network; real deployments would put the model runtime and region here.
const (
	taskRuntime = "standin-v1"
	taskNetwork = "local"
)

// idemRetention is how long the middleware keeps a request's answer for
// replays. Finished tasks are kept longer (taskRetention): a retry that
// finds no record in Redis must still find its task in Postgres.
const idemRetention = 24 * time.Hour

// api is the HTTP side of the service.
type api struct {
	store *pgstore.Store
	pool  *pgxpool.Pool
	redis redis.UniversalClient
	// records, if set, is the idempotency records store instead of Redis
	// (STORE=postgres; redis is then nil).
	records idemgate.Store
	secret  []byte
	logger  *slog.Logger
	obs     *observer // nil: no telemetry
	// lease is the middleware's claim lease (IDEM_LEASE) and exportTime
	// the stand-in renderer's time (EXPORT_TIME); zero: the defaults.
	lease, exportTime time.Duration
	// exportLimit and submitLimit bound the new actions one tenant
	// starts (tenantlimit.go); zero: no limit.
	exportLimit, submitLimit tenantLimit
}

// handler returns the echo instance serving the routes.
func (a *api) handler() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = errorHandler(a.logger)

	e.GET("/healthz", a.healthz)

	records := a.records
	if records == nil {
		records = redisstore.New(a.redis)
	}
	store := a.obs.store(records)
	// With the records in Postgres (STORE=postgres), the routes that write
	// run Atomic: the task or the ledger row commits in one transaction
	// with the stored answer. Redis cannot commit with Postgres.
	atomic := a.records != nil
	idem := func(kind string, atomic bool, fields ...string) echo.MiddlewareFunc {
		return middleware.New(middleware.Config{
			Store:       store,
			Scope:       identity,
			Kind:        kind,
			Fingerprint: fingerprint.Spec{Fields: fields},
			Required:    true,
			Retention:   idemRetention,
			// A duplicate that arrives while the first is still being
			// stored waits for its answer instead of getting a 409.
			WaitInFlight: 2 * time.Second,
			OnEvent:      a.logEvent,
			Logger:       a.logger,
			Atomic:       atomic,
			Lease:        a.lease,
		})
	}
	v1 := e.Group("/v1", authMiddleware(a.secret))
	// Each limit comes after its route's idempotency middleware: only a
	// new action counts, a replay is answered before it.
	submitLimit := a.submitLimit.middleware()
	limited := func(idem echo.MiddlewareFunc, limit echo.MiddlewareFunc) []echo.MiddlewareFunc {
		if limit == nil {
			return []echo.MiddlewareFunc{idem}
		}
		return []echo.MiddlewareFunc{idem, limit}
	}
	v1.POST("/images", a.submitImages,
		limited(idem(kindImages, atomic, "/prompt", "/aspect_ratio", "/n", "/reference_image"), submitLimit)...)
	v1.POST("/music", a.submitMusic, limited(idem(kindMusic, false, "/prompt", "/seconds"), submitLimit)...)
	v1.GET("/tasks/:id", a.getTask)
	v1.GET("/queue", a.queue)
	v1.POST("/tasks/:id/recover", a.recoverTask)
	v1.POST("/tasks/:id/cancel", a.cancelTask)
	v1.POST("/tasks/:id/export", newExporter(a).export, limited(idem(kindExport, atomic), a.exportLimit.middleware())...)
	return e
}

// logEvent logs what the middleware did with a request, so the server's
// output tells the retry story too. Events never carry a key or a body.
func (a *api) logEvent(ctx context.Context, ev idemgate.Event) {
	a.obs.onEvent(ctx, ev)
	switch ev.Type {
	case idemgate.EventClaimed:
		return // the common case; the handler's outcome says enough
	case idemgate.EventStoreError, idemgate.EventLeaseLost, idemgate.EventFailOpen:
		a.logger.Warn("idempotency "+ev.Type.String(), "route", ev.Route, "tenant", ev.Tenant, "reason", ev.Reason, "err", ev.Err)
	default:
		a.logger.Info("idempotency "+ev.Type.String(), "route", ev.Route, "tenant", ev.Tenant, "status", ev.Status)
	}
}

func (a *api) healthz(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
	defer cancel()
	if err := a.pool.Ping(ctx); err != nil {
		a.logger.Warn("healthz: postgres", "err", err)
		return &problem{Status: http.StatusServiceUnavailable, Code: "not_ready", Detail: "postgres does not answer"}
	}
	if a.redis == nil {
		return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
	}
	if err := a.redis.Ping(ctx).Err(); err != nil {
		a.logger.Warn("healthz: redis", "err", err)
		return &problem{Status: http.StatusServiceUnavailable, Code: "not_ready", Detail: "redis does not answer"}
	}
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

// imageRequest is the body of POST /v1/images. N is a pointer so that an
// explicit 0 is refused rather than taken for "absent".
type imageRequest struct {
	Prompt         string  `json:"prompt"`
	AspectRatio    *string `json:"aspect_ratio"`
	N              *int    `json:"n"`
	ReferenceImage string  `json:"reference_image"`
	ClientNote     string  `json:"client_note"`
}

const (
	maxPrompt     = 2000
	maxImages     = 4
	maxClientNote = 500
	maxReference  = 512 << 10
)

// validate checks r and returns the task parameters it asks for.
func (r imageRequest) validate() (imageParams, error) {
	p := imageParams{Prompt: r.Prompt, AspectRatio: "1:1", N: 1, ReferenceImage: r.ReferenceImage}
	if err := checkPrompt(r.Prompt); err != nil {
		return p, err
	}
	if r.AspectRatio != nil {
		if _, ok := aspectSizes[*r.AspectRatio]; !ok {
			return p, invalid("aspect_ratio must be one of 1:1, 16:9, 9:16, 4:3, 3:4")
		}
		p.AspectRatio = *r.AspectRatio
	}
	if r.N != nil {
		if *r.N < 1 || *r.N > maxImages {
			return p, invalid("n must be between 1 and %d", maxImages)
		}
		p.N = *r.N
	}
	if ref := r.ReferenceImage; ref != "" {
		if len(ref) > maxReference {
			return p, invalid("reference_image is longer than %d bytes", maxReference)
		}
		if !strings.HasPrefix(ref, "https://") && !strings.HasPrefix(ref, "http://") && !strings.HasPrefix(ref, "data:image/") {
			return p, invalid("reference_image must be an http(s) URL or a data:image/ URL")
		}
		if strings.IndexByte(ref, 0) >= 0 {
			return p, invalid("reference_image contains a NUL character")
		}
	}
	if utf8.RuneCountInString(r.ClientNote) > maxClientNote {
		return p, invalid("client_note is longer than %d characters", maxClientNote)
	}
	return p, nil
}

func checkPrompt(s string) error {
	switch {
	case strings.TrimSpace(s) == "":
		return invalid("prompt is required")
	case !utf8.ValidString(s):
		return invalid("prompt is not valid UTF-8")
	case strings.IndexByte(s, 0) >= 0:
		// Postgres cannot store it: a 400 now, not a 503 "retry" later.
		return invalid("prompt contains a NUL character")
	case utf8.RuneCountInString(s) > maxPrompt:
		return invalid("prompt is longer than %d characters", maxPrompt)
	}
	return nil
}

// decodeStrict decodes one JSON object into v, refusing unknown fields and
// trailing data.
func decodeStrict(c echo.Context, v any) error {
	if ct := c.Request().Header.Get(echo.HeaderContentType); !strings.HasPrefix(strings.ToLower(ct), echo.MIMEApplicationJSON) {
		return &problem{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type",
			Detail: "send the body as application/json"}
	}
	body, err := io.ReadAll(io.LimitReader(c.Request().Body, 2<<20))
	if err != nil {
		return fmt.Errorf("read body: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return invalid("body: %v", err)
	}
	if dec.More() {
		return invalid("body: data after the JSON object")
	}
	return nil
}

func (a *api) submitImages(c echo.Context) error {
	var req imageRequest
	if err := decodeStrict(c, &req); err != nil {
		return err
	}
	params, err := req.validate()
	if err != nil {
		return err
	}
	return a.submit(c, params)
}

// musicRequest is the body of POST /v1/music.
type musicRequest struct {
	Prompt  string `json:"prompt"`
	Seconds *int   `json:"seconds"`
}

func (a *api) submitMusic(c echo.Context) error {
	var req musicRequest
	if err := decodeStrict(c, &req); err != nil {
		return err
	}
	if err := checkPrompt(req.Prompt); err != nil {
		return err
	}
	p := musicParams{Prompt: req.Prompt, Seconds: 1}
	if req.Seconds != nil {
		if *req.Seconds < 1 || *req.Seconds > maxSeconds {
			return invalid("seconds must be between 1 and %d", maxSeconds)
		}
		p.Seconds = *req.Seconds
	}
	return a.submit(c, p)
}

// submit stores the task under the request's idempotency key and answers
// 202 with where to poll. A row already held by other parameters is
// ErrKeyReused: the middleware turns it into 409 key_reused. That happens
// when Redis lost its record (flushed, failed over) but Postgres still has
// the task: Postgres is the last word.
func (a *api) submit(c echo.Context, params any) error {
	req, ok := middleware.FromContext(c)
	if !ok {
		return errors.New("submit: no idempotency key in context (middleware missing)")
	}
	raw, err := json.Marshal(params)
	if err != nil {
		return fmt.Errorf("submit: encode params: %w", err)
	}
	submit := a.store.Submit
	if tx, ok := pgrecords.TxFromContext(c.Request().Context()); ok {
		// An Atomic route: the task commits with the stored 202, or not at all.
		submit = func(ctx context.Context, t pgstore.NewTask) (pgstore.Task, error) {
			return a.store.SubmitTx(ctx, tx, t)
		}
	}
	task, err := a.obs.submit(c.Request().Context(), pgstore.NewTask{
		Tenant:         req.Key.Tenant(),
		Owner:          req.Key.Owner(),
		Kind:           req.Key.Kind(),
		Runtime:        taskRuntime,
		Network:        taskNetwork,
		IdempotencyKey: req.Key.Task(),
		Fingerprint:    string(req.Fingerprint),
		Params:         raw,
	}, submit)
	if errors.Is(err, pgstore.ErrConflict) {
		return idemgate.ErrKeyReused
	}
	if errors.Is(err, pgstore.ErrInvalidTask) {
		// Parameters no retry can store: a 400 (stored, as the
		// validation's own), never a 503 that asks for the same again.
		return invalid("the task's parameters cannot be stored: %s",
			strings.TrimPrefix(err.Error(), pgstore.ErrInvalidTask.Error()+": "))
	}
	if err != nil {
		// Postgres is down or restarting: a retryable answer. The middleware
		// does not store 5xx, so the retry runs again under the same key.
		a.logger.Error("submit failed", "err", err)
		c.Response().Header().Set("Retry-After", "1")
		return &problem{Status: http.StatusServiceUnavailable, Code: "task_store_unavailable",
			Detail: "The task store is unavailable; retry with the same Idempotency-Key."}
	}
	pr := pgstore.Project(task)
	poll := pr.PollAfter
	if poll <= 0 {
		poll = time.Second // already finished (read back after a Redis loss): poll once to get it
	}
	h := c.Response().Header()
	h.Set(echo.HeaderLocation, "/v1/tasks/"+task.ID)
	h.Set("Retry-After", retryAfter(poll.Milliseconds()))
	return c.JSON(http.StatusAccepted, accepted{TaskID: task.ID, Status: string(pr.State), PollAfterMS: poll.Milliseconds()})
}

// accepted is the body of a 202 answer to a submit.
type accepted struct {
	TaskID      string `json:"task_id"`
	Status      string `json:"status"`
	PollAfterMS int64  `json:"poll_after_ms"`
}

// taskView is the body of GET /v1/tasks/{id}.
type taskView struct {
	TaskID      string   `json:"task_id"`
	Status      string   `json:"status"`
	PollAfterMS int64    `json:"poll_after_ms,omitempty"`
	Images      []string `json:"images,omitempty"`
	Tracks      []string `json:"tracks,omitempty"`
	Error       string   `json:"error,omitempty"`
}

// viewOf turns a task's projection into the API's answer: results as data
// URLs only on success, a poll interval only while not finished, an error
// only on failure.
func viewOf(t pgstore.Task) (taskView, error) {
	pr := pgstore.Project(t)
	v := taskView{TaskID: pr.TaskID, Status: string(pr.State), Error: pr.Error}
	if wait := pr.PollAfterAt(time.Now()); wait > 0 { // a scheduled task: not before its time
		v.PollAfterMS = max(wait.Milliseconds(), 1)
	}
	if pr.Results != nil {
		urls := make([]string, 0, len(pr.Results))
		for _, r := range pr.Results {
			var u string
			if err := json.Unmarshal(r, &u); err != nil {
				return v, fmt.Errorf("task %s: result is not a data URL: %w", t.ID, err)
			}
			urls = append(urls, u)
		}
		if t.Kind == kindMusic {
			v.Tracks = urls
		} else {
			v.Images = urls
		}
	}
	return v, nil
}

// owner returns the tenant segment and owner digest that tasks of the
// caller are stored under: the same values the idempotency key carries.
func owner(c echo.Context) (tenant, ownerID string, err error) {
	t, u, err := identity(c)
	if err != nil {
		return "", "", err
	}
	k, err := keyspace.Derive(kindImages, keyspace.Scope{Tenant: t, User: u, Request: "-"})
	if err != nil {
		return "", "", &problem{Status: http.StatusUnauthorized, Code: "unauthorized", Detail: "token identity: " + err.Error()}
	}
	return k.Tenant(), k.Owner(), nil
}

// errTaskNotFound is the answer for a task that does not exist or belongs
// to someone else: the two are indistinguishable on purpose.
func errTaskNotFound() error {
	return &problem{Status: http.StatusNotFound, Code: "not_found", Detail: "no such task"}
}

func (a *api) getTask(c echo.Context) error {
	tenant, ownerID, err := owner(c)
	if err != nil {
		return err
	}
	t, err := a.store.Get(c.Request().Context(), tenant, ownerID, c.Param("id"))
	if errors.Is(err, pgstore.ErrNotFound) {
		return errTaskNotFound()
	}
	if err != nil {
		return a.storeUnavailable(c, "get task", err)
	}
	v, err := viewOf(t)
	if err != nil {
		return err
	}
	c.Response().Header().Set("Cache-Control", "no-store")
	if v.PollAfterMS > 0 {
		c.Response().Header().Set("Retry-After", retryAfter(v.PollAfterMS))
	}
	return c.JSON(http.StatusOK, v)
}

func (a *api) recoverTask(c echo.Context) error {
	tenant, ownerID, err := owner(c)
	if err != nil {
		return err
	}
	t, err := a.store.Recover(c.Request().Context(), tenant, ownerID, c.Param("id"))
	switch {
	case errors.Is(err, pgstore.ErrNotFound):
		return errTaskNotFound()
	case errors.Is(err, pgstore.ErrNotRecoverable):
		return &problem{Status: http.StatusConflict, Code: "not_recoverable",
			Detail: strings.TrimPrefix(err.Error(), pgstore.ErrNotRecoverable.Error()+": ")}
	case err != nil:
		return a.storeUnavailable(c, "recover task", err)
	}
	v, err := viewOf(t)
	if err != nil {
		return err
	}
	c.Response().Header().Set(echo.HeaderLocation, "/v1/tasks/"+t.ID)
	return c.JSON(http.StatusAccepted, v)
}

// cancelTask ends the caller's task as cancelled and answers 200 with
// the task as GET shows it: the same answer however often it is sent. A
// task that had already finished stays as it was, and the answer shows
// that (succeeded or failed). A running attempt is stopped.
func (a *api) cancelTask(c echo.Context) error {
	tenant, ownerID, err := owner(c)
	if err != nil {
		return err
	}
	t, err := a.store.Cancel(c.Request().Context(), tenant, ownerID, c.Param("id"))
	switch {
	case errors.Is(err, pgstore.ErrNotFound):
		return errTaskNotFound()
	case err != nil && !errors.Is(err, pgstore.ErrFinished):
		return a.storeUnavailable(c, "cancel task", err)
	}
	v, err := viewOf(t)
	if err != nil {
		return err
	}
	c.Response().Header().Set("Cache-Control", "no-store")
	return c.JSON(http.StatusOK, v)
}

// storeUnavailable answers a task-store failure (Postgres down, restarting
// or out of connections) with a retryable 503 and Retry-After, as submit
// does, instead of a bare 500: the client polls or retries the same call.
func (a *api) storeUnavailable(c echo.Context, what string, err error) error {
	a.logger.Error(what+" failed", "err", err)
	c.Response().Header().Set("Retry-After", "1")
	return &problem{Status: http.StatusServiceUnavailable, Code: "task_store_unavailable",
		Detail: "The task store is unavailable; retry the same request."}
}

// retryAfter is the Retry-After value for a poll hint in milliseconds:
// whole seconds, rounded up, at least 1. It works in milliseconds, as the
// hint does: a hint near the largest Duration (a task scheduled centuries
// ahead) cannot overflow into "retry in 1 s".
func retryAfter(pollAfterMS int64) string {
	return strconv.FormatInt(max(1, pollAfterMS/1000+min(1, pollAfterMS%1000)), 10)
}

// kindQueue is one kind's line of GET /v1/queue: what of the caller's
// tenant runs and waits, and the kind's cluster-wide limits (0: none).
type kindQueue struct {
	Kind                string  `json:"kind"`
	Running             int     `json:"running"`
	Waiting             int     `json:"waiting"` // pending and retrying
	Paused              bool    `json:"paused"`
	MaxRunning          int     `json:"max_running"`
	MaxRunningPerTenant int     `json:"max_running_per_tenant"`
	StartsPerSecond     float64 `json:"starts_per_second"`
}

// queue answers GET /v1/queue: the caller's tenant's tasks per kind, and
// the kinds' limits, for the page. Only the tenant's own counts:
// pgstore's Stats counts every tenant's, which would show one tenant the
// others' activity.
func (a *api) queue(c echo.Context) error {
	ctx := c.Request().Context()
	tenant, _, err := owner(c)
	if err != nil {
		return err
	}
	counts, err := tenantCounts(ctx, a.pool, tenant)
	if err != nil {
		return a.storeUnavailable(c, "queue counts", err)
	}
	out := make([]kindQueue, 0, 2)
	for _, kind := range []string{kindImages, kindMusic} {
		l, err := a.store.KindLimits(ctx, kind)
		if err != nil {
			return a.storeUnavailable(c, "kind limits", err)
		}
		n := counts[kind]
		out = append(out, kindQueue{Kind: kind, Running: n.running, Waiting: n.waiting, Paused: l.Paused,
			MaxRunning: l.MaxRunning, MaxRunningPerTenant: l.MaxRunningPerTenant, StartsPerSecond: l.StartsPerSecond})
	}
	c.Response().Header().Set("Cache-Control", "no-store")
	return c.JSON(http.StatusOK, map[string]any{"kinds": out})
}

// kindCount is one kind's running and waiting (pending, retrying) tasks.
type kindCount struct{ running, waiting int }

// tenantCounts reads the unfinished tasks of tenant (the keyspace tenant
// segment tasks are stored under) by kind. It reads pgstore's table
// itself: pgstore counts per kind only, for operators. The unique key
// index leads with the tenant, so this reads that tenant's rows only.
func tenantCounts(ctx context.Context, pool *pgxpool.Pool, tenant string) (map[string]kindCount, error) {
	rows, err := pool.Query(ctx, `SELECT kind,
		count(*) FILTER (WHERE state = 'running'),
		count(*) FILTER (WHERE state IN ('pending', 'retrying'))
		FROM idemgate_tasks WHERE tenant = $1 AND state IN ('pending', 'running', 'retrying') GROUP BY kind`, tenant)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]kindCount{}
	for rows.Next() {
		var (
			kind string
			n    kindCount
		)
		if err := rows.Scan(&kind, &n.running, &n.waiting); err != nil {
			return nil, err
		}
		out[kind] = n
	}
	return out, rows.Err()
}
