package otelidem_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/otelidem"
	"github.com/idemgate/idemgate/pgstore"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// newStore returns a migrated pgstore on a fresh real database.
func newStore(t *testing.T) (*pgstore.Store, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := pgstore.New(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return s, pool
}

func newTask(key string) pgstore.NewTask {
	return pgstore.NewTask{Tenant: "acme", Owner: "owner-a", Kind: "image", Runtime: "gpu", Network: "main",
		IdempotencyKey: key, Fingerprint: "v1:aaaa", Params: []byte(`{"prompt":"a cat"}`)}
}

// runWorker runs a worker whose handler succeeds, instrumented by rec,
// until the test ends.
func runWorker(t *testing.T, s *pgstore.Store, rec *otelidem.Recorder) {
	t.Helper()
	w, err := pgstore.NewWorker(s, pgstore.WorkerConfig{
		Handler: rec.Attempt(func(ctx context.Context, task pgstore.Task) pgstore.Outcome {
			return pgstore.Succeeded(json.RawMessage(`"png"`))
		}),
		OnEvent:        rec.OnWorkerEvent,
		Concurrency:    2,
		Lease:          2 * time.Second,
		PollInterval:   50 * time.Millisecond,
		RescueInterval: 50 * time.Millisecond,
		BackoffBase:    time.Millisecond,
		BackoffMax:     time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// eventually polls cond for up to 30 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("%s: not within 30s", what)
}

// gauge returns the value of an observable instrument's point whose
// attributes include want.
func gauge(t *testing.T, rm metricdata.ResourceMetrics, name string, want ...attribute.KeyValue) float64 {
	t.Helper()
	switch d := find(t, rm, name).Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				return float64(p.Value)
			}
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				return p.Value
			}
		}
	}
	t.Fatalf("no point of %s with %v", name, want)
	return 0
}

// TestTaskMetrics submits two tasks, one of which a dead worker had
// claimed, and reads the task instruments: counts by state before and
// after, the oldest runnable age, claims, attempts and the rescue.
func TestTaskMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t, otelidem.Config{})
	s, pool := newStore(t)
	unregister, err := b.rec.ObserveTasks(s, "music") // a kind with no task yet still reports zeros
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unregister() })
	ctx := context.Background()

	ok, err := b.rec.Submit(ctx, newTask("ok"), s.Submit)
	if err != nil {
		t.Fatal(err)
	}
	dead, err := b.rec.Submit(ctx, newTask("dead"), s.Submit)
	if err != nil {
		t.Fatal(err)
	}
	// A worker claimed "dead" and died: running, its lease already gone.
	if _, err := pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'running', attempt = attempt + 1, tries = tries + 1,
		lease_until = now() - interval '1 second', locked_by = 'dead-worker' WHERE id = $1`, dead.ID); err != nil {
		t.Fatal(err)
	}

	kind := attribute.String("idemgate.task.kind", "image")
	state := func(s string) attribute.KeyValue { return attribute.String("idemgate.task.state", s) }
	rm := b.collect(t)
	for _, c := range []struct {
		state string
		want  float64
	}{{"pending", 1}, {"running", 1}, {"retrying", 0}, {"uncertain", 0}} {
		if got := gauge(t, rm, "idemgate.tasks", kind, state(c.state)); got != c.want {
			t.Errorf("before: idemgate.tasks{%s} = %v, want %v", c.state, got, c.want)
		}
	}
	if got := gauge(t, rm, "idemgate.tasks", attribute.String("idemgate.task.kind", "music"), state("pending")); got != 0 {
		t.Errorf("idemgate.tasks{music,pending} = %v, want 0", got)
	}
	if got := gauge(t, rm, "idemgate.task.oldest.age", attribute.String("idemgate.task.queue", "runnable")); got <= 0 {
		t.Errorf("oldest runnable age = %v, want > 0 with a pending task", got)
	}
	if got := gauge(t, rm, "idemgate.task.oldest.age", attribute.String("idemgate.task.queue", "uncertain")); got != 0 {
		t.Errorf("oldest uncertain age = %v, want 0 with none", got)
	}

	runWorker(t, s, b.rec)
	succeeded := attribute.String("idemgate.task.outcome", "succeeded")
	eventually(t, "both tasks succeed", func() bool {
		rm := b.collect(t)
		return hasMetric(rm, "idemgate.task.attempts") && count(t, rm, "idemgate.task.attempts", kind, succeeded) == 2
	})
	for _, id := range []string{ok.ID, dead.ID} {
		got, err := s.Get(ctx, "acme", "owner-a", id)
		if err != nil || got.State != pgstore.StateSucceeded {
			t.Fatalf("task %s: %s %v", id, got.State, err)
		}
	}

	rm = b.collect(t)
	for _, c := range []struct {
		name string
		want int64
	}{
		{"idemgate.task.rescues", 1},
		{"idemgate.task.claim.duration", 2},   // each task claimed once by the live worker
		{"idemgate.task.attempt.duration", 2}, // two attempts ended
		{"idemgate.task.stale_completions", 0},
		{"idemgate.task.outcome_write.retries", 0},
	} {
		var got int64
		if c.want > 0 || hasMetric(rm, c.name) {
			got = count(t, rm, c.name, kind)
		}
		if got != c.want {
			t.Errorf("%s = %d, want %d", c.name, got, c.want)
		}
	}
	for _, st := range []string{"pending", "running", "retrying", "uncertain"} {
		if got := gauge(t, rm, "idemgate.tasks", kind, state(st)); got != 0 {
			t.Errorf("after: idemgate.tasks{%s} = %v, want 0", st, got)
		}
	}

	// Each attempt span joined its submit's trace and ended with its outcome.
	submits := map[string]sdktrace.ReadOnlySpan{}
	attempts := map[string]sdktrace.ReadOnlySpan{}
	for _, sp := range b.spans.Ended() {
		id := attr(sp, "idemgate.task.id")
		switch sp.Name() {
		case "idemgate.task.submit":
			submits[id] = sp
		case "idemgate.task.attempt":
			attempts[id] = sp
		}
	}
	for _, id := range []string{ok.ID, dead.ID} {
		sub, att := submits[id], attempts[id]
		if sub == nil || att == nil {
			t.Fatalf("task %s: submit span %v, attempt span %v", id, sub != nil, att != nil)
		}
		if att.Parent().SpanID() != sub.SpanContext().SpanID() || att.SpanContext().TraceID() != sub.SpanContext().TraceID() {
			t.Errorf("task %s: the attempt span is not a child of its submit span", id)
		}
		if got := attr(att, "idemgate.task.outcome"); got != "succeeded" {
			t.Errorf("task %s: attempt outcome %q", id, got)
		}
	}
	if got := attr(attempts[dead.ID], "idemgate.task.attempt"); got != "2" {
		t.Errorf("rescued task's attempt span has attempt %s, want 2", got)
	}
}

func hasMetric(rm metricdata.ResourceMetrics, name string) bool {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return true
			}
		}
	}
	return false
}

func attr(sp sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range sp.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

// TestOneTrace follows one request through the middleware, Submit and the
// worker: one trace holds the server span, the claim, the submit, the
// complete and the attempt, each under the right parent.
func TestOneTrace(t *testing.T) {
	t.Parallel()
	b := setup(t, otelidem.Config{})
	s, _ := newStore(t)
	svc := newService(t, b)
	svc.e.POST("/v1/tasks", func(c echo.Context) error {
		req, _ := middleware.FromContext(c)
		task, err := b.rec.Submit(c.Request().Context(), pgstore.NewTask{
			Tenant: req.Key.Tenant(), Owner: req.Key.Owner(), Kind: "image", Runtime: "gpu", Network: "main",
			IdempotencyKey: req.Key.Task(), Fingerprint: string(req.Fingerprint), Params: []byte(`{}`),
		}, s.Submit)
		if err != nil {
			return err
		}
		return c.JSON(http.StatusAccepted, map[string]string{"task_id": task.ID})
	}, middleware.New(middleware.Config{
		Store: b.rec.Store(middleware.NewRedisStore(svc.rdb)),
		Scope: func(c echo.Context) (string, string, error) { return "acme", "alice", nil },
		Kind:  "image", Required: true, OnEvent: b.rec.OnEvent,
	}))
	runWorker(t, s, b.rec)

	rec := svc.postTo("/v1/tasks", "trace:1", "a lighthouse")
	if rec.Code != http.StatusAccepted {
		t.Fatalf("status %d %s", rec.Code, rec.Body)
	}
	var spans map[string]sdktrace.ReadOnlySpan
	eventually(t, "attempt span ends", func() bool {
		spans = map[string]sdktrace.ReadOnlySpan{}
		for _, sp := range b.spans.Ended() {
			spans[sp.Name()] = sp
		}
		return spans["idemgate.task.attempt"] != nil
	})
	server := spans["POST /v1/tasks"]
	if server == nil {
		t.Fatalf("no server span: %v", names(b.spans.Ended()))
	}
	for _, c := range []struct{ child, parent string }{
		{"idemgate.claim", "POST /v1/tasks"},
		{"idemgate.task.submit", "POST /v1/tasks"},
		{"idemgate.complete", "POST /v1/tasks"},
		{"idemgate.task.attempt", "idemgate.task.submit"},
	} {
		child, parent := spans[c.child], spans[c.parent]
		if child == nil || parent == nil {
			t.Fatalf("missing %s or %s: %v", c.child, c.parent, names(b.spans.Ended()))
		}
		if child.SpanContext().TraceID() != server.SpanContext().TraceID() {
			t.Errorf("%s is in trace %s, not the request's %s", c.child, child.SpanContext().TraceID(), server.SpanContext().TraceID())
		}
		if child.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("%s's parent is %s, want %s", c.child, child.Parent().SpanID(), c.parent)
		}
	}
}

// FuzzAttemptTrace feeds Task.Trace values that the database might hold
// (anything a client library wrote): the attempt span either continues a
// valid traceparent or starts a new trace, and never panics.
func FuzzAttemptTrace(f *testing.F) {
	for _, s := range []string{"", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", "garbage"} {
		f.Add(s)
	}
	b := setup(f, otelidem.Config{})
	h := b.rec.Attempt(func(ctx context.Context, task pgstore.Task) pgstore.Outcome {
		sc := trace.SpanContextFromContext(ctx)
		if !sc.IsValid() {
			panic("the attempt's context has no span")
		}
		parent := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
			propagation.MapCarrier{"traceparent": task.Trace}))
		if parent.IsValid() && sc.TraceID() != parent.TraceID() {
			panic("a valid traceparent was not continued")
		}
		return pgstore.Succeeded(json.RawMessage(`1`))
	})
	f.Fuzz(func(t *testing.T, tp string) {
		h(context.Background(), pgstore.Task{ID: "t", Kind: "image", Attempt: 1, Trace: tp})
		b.rec.OnWorkerEvent(pgstore.WorkerEvent{Type: pgstore.WorkerSucceeded, Kind: "image", TaskID: "t", Attempt: 1})
	})
}

// TestConcurrentRecording runs attempts, worker events and middleware
// events from many goroutines at once (run it with -race): every attempt
// span ends once, with its own outcome, and every event is counted.
func TestConcurrentRecording(t *testing.T) {
	t.Parallel()
	b := setup(t, otelidem.Config{Tenant: true})
	h := b.rec.Attempt(func(ctx context.Context, task pgstore.Task) pgstore.Outcome {
		return pgstore.Succeeded(json.RawMessage(`1`))
	})
	const goroutines, each = 32, 48 // each a multiple of len(outcomes)
	outcomes := []pgstore.WorkerEventType{pgstore.WorkerSucceeded, pgstore.WorkerFailed, pgstore.WorkerRetried, pgstore.WorkerStale}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("task-%d-%d", g, i)
				h(context.Background(), pgstore.Task{ID: id, Kind: "image", Attempt: 1,
					Trace: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
				b.rec.OnWorkerEvent(pgstore.WorkerEvent{Type: outcomes[i%len(outcomes)], Kind: "image", TaskID: id, Attempt: 1})
				b.rec.OnEvent(middleware.Event{Type: middleware.EventReplayed, Route: "POST /v1/images", Kind: "images", Tenant: "acme"})
			}
		})
	}
	wg.Wait()
	rm := b.collect(t)
	if got := count(t, rm, "idemgate.requests", attribute.String("idemgate.outcome", "replayed")); got != goroutines*each {
		t.Errorf("replayed = %d, want %d", got, goroutines*each)
	}
	for _, o := range outcomes {
		if got := count(t, rm, "idemgate.task.attempts", attribute.String("idemgate.task.outcome", string(o))); got != int64(goroutines*each/len(outcomes)) {
			t.Errorf("attempts{%s} = %d, want %d", o, got, goroutines*each/len(outcomes))
		}
	}
	ended := map[string]string{}
	for _, sp := range b.spans.Ended() {
		if sp.Name() != "idemgate.task.attempt" {
			continue
		}
		id := attr(sp, "idemgate.task.id")
		if _, dup := ended[id]; dup {
			t.Errorf("attempt span of %s ended twice", id)
		}
		ended[id] = attr(sp, "idemgate.task.outcome")
	}
	if len(ended) != goroutines*each {
		t.Fatalf("%d attempt spans ended, want %d", len(ended), goroutines*each)
	}
	for id, o := range ended {
		var g, i int
		fmt.Sscanf(id, "task-%d-%d", &g, &i)
		if want := string(outcomes[i%len(outcomes)]); o != want {
			t.Errorf("%s ended with %q, want %q", id, o, want)
		}
	}
}

// TestAttemptSpanLimit: an attempt whose outcome event never comes ends
// its span with the outcome "unknown"; one whose event races the limit
// ends exactly once either way (run with -race).
func TestAttemptSpanLimit(t *testing.T) {
	t.Parallel()
	// A limit of 1 ns fires at once: it races the storing of the attempt too.
	b := setup(t, otelidem.Config{AttemptSpanLimit: time.Nanosecond})
	h := b.rec.Attempt(func(ctx context.Context, task pgstore.Task) pgstore.Outcome {
		return pgstore.Succeeded(json.RawMessage(`1`))
	})
	const n = 200
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id := fmt.Sprintf("task-%d", i)
			h(context.Background(), pgstore.Task{ID: id, Kind: "image", Attempt: 1})
			if i%2 == 0 { // the odd ones never hear how they ended
				b.rec.OnWorkerEvent(pgstore.WorkerEvent{Type: pgstore.WorkerSucceeded, Kind: "image", TaskID: id, Attempt: 1})
			}
		})
	}
	wg.Wait()
	ended := map[string]string{}
	eventually(t, "every attempt span ends", func() bool {
		ended = map[string]string{}
		for _, sp := range b.spans.Ended() {
			id := attr(sp, "idemgate.task.id")
			if _, dup := ended[id]; dup {
				t.Fatalf("span of %s ended twice", id)
			}
			ended[id] = attr(sp, "idemgate.task.outcome")
		}
		return len(ended) == n
	})
	for id, o := range ended {
		var i int
		fmt.Sscanf(id, "task-%d", &i)
		if i%2 == 1 && o != "unknown" {
			t.Errorf("%s never heard its outcome but ended %q, want unknown", id, o)
		}
		if i%2 == 0 && o != "succeeded" && o != "unknown" {
			t.Errorf("%s ended %q", id, o)
		}
	}
}
