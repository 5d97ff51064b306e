package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/internal/opsbench"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/internal/wait"
	"github.com/idemgate/idemgate/pgstore"
)

// taskNode is an API and its stores in this process, without workers.
type taskNode struct {
	b      *backends
	e      *echo.Echo
	secret []byte
}

func newTaskNode(t *testing.T) *taskNode {
	t.Helper()
	pool, store := opsbench.Migrated(t, testenv.PostgresDSN(t))
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { rdb.Close() })
	secret := []byte("s3cret")
	a := &api{store: store, pool: pool, redis: rdb, secret: secret, logger: slog.New(slog.DiscardHandler)}
	return &taskNode{b: &backends{pool: pool, store: store}, e: a.handler(), secret: secret}
}

// startWorkers runs workers on the node until the test ends (or stop).
func (n *taskNode) startWorkers(t *testing.T, took time.Duration) (stop func()) {
	t.Helper()
	p, err := startWorkers(n.b, 2, generator{took: took}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	stop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		p.stop(ctx)
	}
	t.Cleanup(stop)
	return stop
}

// do sends a request as user and returns the status and the JSON body.
func (n *taskNode) do(t *testing.T, user, method, path, key, body string) (int, map[string]any) {
	t.Helper()
	tok, err := mintToken(n.secret, "acme", user, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	rec := httptest.NewRecorder()
	n.e.ServeHTTP(rec, req)
	var v map[string]any
	_ = json.Unmarshal(rec.Body.Bytes(), &v)
	return rec.Code, v
}

// waitStatus polls the task as alice until its status is want.
func (n *taskNode) waitStatus(t *testing.T, id, want string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, v := n.do(t, "alice", http.MethodGet, "/v1/tasks/"+id, "", "")
		if v["status"] == want {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s is %v; want %s", id, v["status"], want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCancelRoute(t *testing.T) {
	t.Parallel()
	n := newTaskNode(t)
	n.startWorkers(t, time.Hour) // a generation that never ends by itself
	code, v := n.do(t, "alice", http.MethodPost, "/v1/images", "cancel:1", `{"prompt":"a slow cat","n":1}`)
	if code != http.StatusAccepted {
		t.Fatalf("submit: %d %v", code, v)
	}
	id := v["task_id"].(string)
	n.waitStatus(t, id, "running")

	if code, v := n.do(t, "bob", http.MethodPost, "/v1/tasks/"+id+"/cancel", "", ""); code != http.StatusNotFound {
		t.Fatalf("another user's cancel: %d %v; want 404", code, v)
	}
	for i := range 2 { // idempotent
		code, v := n.do(t, "alice", http.MethodPost, "/v1/tasks/"+id+"/cancel", "", "")
		if code != http.StatusOK || v["status"] != "cancelled" || v["task_id"] != id || v["poll_after_ms"] != nil || v["images"] != nil {
			t.Fatalf("cancel %d: %d %v; want 200 cancelled, final, no images", i+1, code, v)
		}
	}
	n.waitStatus(t, id, "cancelled")

	// A finished task stays as it was, and the answer says so.
	n2 := newTaskNode(t)
	n2.startWorkers(t, time.Millisecond)
	_, v = n2.do(t, "alice", http.MethodPost, "/v1/images", "cancel:2", `{"prompt":"a quick cat","n":1}`)
	done := v["task_id"].(string)
	n2.waitStatus(t, done, "succeeded")
	code, v = n2.do(t, "alice", http.MethodPost, "/v1/tasks/"+done+"/cancel", "", "")
	if code != http.StatusOK || v["status"] != "succeeded" || v["images"] == nil {
		t.Fatalf("cancel of a finished task: %d %v; want 200 with the success", code, v)
	}
}

// TestLostImageAttemptIsReconciled: an image attempt cut off after its
// request reached the upstream (the worker shut down before the upstream
// answered) becomes uncertain, and another worker's reconcile asks the
// stand-in upstream, which had done the work: one upstream call, and the
// images on the same task.
func TestLostImageAttemptIsReconciled(t *testing.T) {
	t.Parallel()
	n := newTaskNode(t)
	const took = 6 * time.Second // longer than workerDrain: the shutdown releases the task
	stop := n.startWorkers(t, took)
	_, v := n.do(t, "alice", http.MethodPost, "/v1/images", "lost:1", `{"prompt":"a patient cat","n":2}`)
	id := v["task_id"].(string)
	up := upstream{gen: generator{took: took}, log: n.b.pool}
	wait.For(t, time.Minute, "the task's request at the upstream", func() bool {
		c, err := up.calls(context.Background(), id)
		return err == nil && c == 1
	})
	stop() // releases the running task by the images policy: uncertain
	if task := n.waitStatus(t, id, "uncertain"); task["images"] != nil {
		t.Fatalf("uncertain task shows images: %v", task)
	}
	n.startWorkers(t, took)
	got := n.waitStatus(t, id, "succeeded")
	if imgs, _ := got["images"].([]any); len(imgs) != 2 {
		t.Fatalf("reconciled task has %d images; want 2", len(imgs))
	}
	if c, err := up.calls(context.Background(), id); err != nil || c != 1 {
		t.Fatalf("the upstream got %d calls (%v); want 1", c, err)
	}
}

// TestReconcileAsksTheUpstream: what the stand-in upstream says of a
// request decides what reconcile does.
func TestReconcileAsksTheUpstream(t *testing.T) {
	t.Parallel()
	n := newTaskNode(t)
	ctx := context.Background()
	up := upstream{gen: generator{took: time.Millisecond}, log: n.b.pool}
	if err := up.prepare(ctx); err != nil {
		t.Fatal(err)
	}
	r := runner{up: up, logger: slog.New(slog.DiscardHandler)}
	params, _ := json.Marshal(imageParams{Prompt: "a cat", AspectRatio: "1:1", N: 1})
	task := func(id string) pgstore.Task { return pgstore.Task{ID: id, Kind: kindImages, Params: params} }
	// done: called, finished.
	if _, err := up.call(ctx, "done", "", imageParams{Prompt: "a cat", AspectRatio: "1:1", N: 1}, 0); err != nil {
		t.Fatal(err)
	}
	// running: called, the upstream still works on it.
	slow := upstream{gen: generator{took: time.Hour}, log: n.b.pool}
	callCtx, cancel := context.WithCancel(ctx)
	go func() {
		_, _ = slow.call(callCtx, "running", "", imageParams{Prompt: "a cat", AspectRatio: "1:1", N: 1}, 0)
	}()
	wait.For(t, time.Minute, "the slow call at the upstream", func() bool { c, _ := up.calls(ctx, "running"); return c == 1 })
	cancel()
	tests := []struct {
		name string
		id   string
		want finding
	}{
		{name: "never received: run again", id: "never", want: foundNever},
		{name: "still running: ask later", id: "running", want: foundRunning},
		{name: "done: its images", id: "done", want: foundFinished},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, _ := r.reconcileImages(ctx, task(tt.id)); got != tt.want {
				t.Fatalf("reconcile of %s found %d; want %d", tt.id, got, tt.want)
			}
		})
	}
}

// TestPruneKeepsWhatARetryCouldReach: the worker process's pruner deletes
// finished tasks only when no replay of their request can come back:
// never one younger than the middleware's retention, never an unfinished one.
func TestPruneKeepsWhatARetryCouldReach(t *testing.T) {
	t.Parallel()
	if taskRetention < idemRetention {
		t.Fatalf("tasks are kept %v, less than the middleware's %v", taskRetention, idemRetention)
	}
	n := newTaskNode(t)
	ctx := context.Background()
	tests := []struct {
		name       string
		finished   time.Duration // ago; 0: unfinished (uncertain)
		wantPruned bool
	}{
		{name: "finished past the task retention", finished: taskRetention + time.Hour, wantPruned: true},
		{name: "finished past the middleware's retention only", finished: idemRetention + time.Hour},
		{name: "finished just now", finished: time.Minute},
		{name: "uncertain for ages", finished: 0},
	}
	ids := make([]string, len(tests))
	for i, tt := range tests {
		task, err := n.b.store.Submit(ctx, pgstore.NewTask{Tenant: "acme", Owner: "o", Kind: kindImages,
			IdempotencyKey: tt.name, Fingerprint: "v1:f"})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = task.ID
		set := "state = 'uncertain', created_at = now() - interval '1 microsecond' * $2::bigint - interval '1000 hours'"
		if tt.finished > 0 {
			set = "state = 'succeeded', results = '[1]', finished_at = now() - $2::bigint * interval '1 microsecond', " +
				"created_at = now() - $2::bigint * interval '1 microsecond'"
		}
		if _, err := n.b.pool.Exec(ctx, "UPDATE idemgate_tasks SET "+set+" WHERE id = $1::uuid", task.ID, tt.finished.Microseconds()); err != nil {
			t.Fatal(err)
		}
	}
	pruneOnce(ctx, n.b.store, slog.New(slog.DiscardHandler))
	for i, tt := range tests {
		var left int
		if err := n.b.pool.QueryRow(ctx, "SELECT count(*) FROM idemgate_tasks WHERE id = $1::uuid", ids[i]).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if pruned := left == 0; pruned != tt.wantPruned {
			t.Errorf("%s: pruned %v; want %v", tt.name, pruned, tt.wantPruned)
		}
	}
}
