package otelpgstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgate/idemgate/internal/wait"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/otelidem"
	"github.com/idemgate/idemgate/otelidem/internal/sdktest/oteltest"
	"github.com/idemgate/idemgate/otelidem/otelpgstore"
	"github.com/idemgate/idemgate/pgstore"
	"github.com/idemgate/idemgate/redisstore"
)

// TestOneTrace follows one request through the middleware (instrumented by
// otelidem), Submit and the worker: one trace holds the server span, the
// claim, the submit, the complete and the attempt, each under the right
// parent, although two Recorders made them.
func TestOneTrace(t *testing.T) {
	t.Parallel()
	b := setup(t, otelpgstore.Config{})
	web, err := otelidem.New(otelidem.Config{MeterProvider: b.MeterProvider, TracerProvider: b.TracerProvider})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := newStore(t)
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	e := echo.New()
	e.Use(web.Server())
	e.POST("/v1/tasks", func(c echo.Context) error {
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
		Store: web.Store(redisstore.New(rdb)),
		Scope: func(c echo.Context) (string, string, error) { return "acme", "alice", nil },
		Kind:  "image", Required: true, OnEvent: web.OnEvent,
	}))
	runWorker(t, s, b.rec)

	req := httptest.NewRequest(http.MethodPost, "/v1/tasks", strings.NewReader(`{"prompt":"a lighthouse"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "trace:1")
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, req)
	if rec.Code != http.StatusAccepted {
		t.Fatalf("status %d %s", rec.Code, rec.Body)
	}
	var spans map[string]sdktrace.ReadOnlySpan
	wait.For(t, 30*time.Second, "attempt span ends", func() bool {
		spans = map[string]sdktrace.ReadOnlySpan{}
		for _, sp := range b.Spans.Ended() {
			spans[sp.Name()] = sp
		}
		return spans["idemgate.task.attempt"] != nil
	})
	server := spans["POST /v1/tasks"]
	if server == nil {
		t.Fatalf("no server span: %v", oteltest.Names(b.Spans.Ended()))
	}
	if got := server.SpanContext().TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("server span trace %s does not continue the caller's", got)
	}
	for _, c := range []struct{ child, parent string }{
		{"idemgate.claim", "POST /v1/tasks"},
		{"idemgate.task.submit", "POST /v1/tasks"},
		{"idemgate.complete", "POST /v1/tasks"},
		{"idemgate.task.attempt", "idemgate.task.submit"},
	} {
		child, parent := spans[c.child], spans[c.parent]
		if child == nil || parent == nil {
			t.Fatalf("missing %s or %s: %v", c.child, c.parent, oteltest.Names(b.Spans.Ended()))
		}
		if child.SpanContext().TraceID() != server.SpanContext().TraceID() {
			t.Errorf("%s is in trace %s, not the request's %s", c.child, child.SpanContext().TraceID(), server.SpanContext().TraceID())
		}
		if child.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("%s's parent is %s, want %s", c.child, child.Parent().SpanID(), c.parent)
		}
	}
}

// TestSubmitErrorKeepsKeyOutOfSpan: Submit's error names the task's
// idempotency key; the caller gets the error unchanged, the submit span
// records it without the key.
func TestSubmitErrorKeepsKeyOutOfSpan(t *testing.T) {
	b := setup(t, otelpgstore.Config{})
	nt := pgstore.NewTask{Tenant: "acme", Owner: "alice", Kind: "image", IdempotencyKey: "SECRETKEY-9"}
	_, err := b.rec.Submit(context.Background(), nt, func(_ context.Context, t pgstore.NewTask) (pgstore.Task, error) {
		return pgstore.Task{}, fmt.Errorf("pgstore: submit %q: boom", t.IdempotencyKey)
	})
	if err == nil || !strings.Contains(err.Error(), "SECRETKEY") {
		t.Fatalf("Submit error %v, want the store's own error back unchanged", err)
	}
	spans := b.Spans.Ended()
	if len(spans) != 1 || len(spans[0].Events()) == 0 {
		t.Fatalf("spans %v, want one with an error event", oteltest.Names(spans))
	}
	for _, ev := range spans[0].Events() {
		for _, kv := range ev.Attributes {
			if strings.Contains(kv.Value.String(), "SECRETKEY") {
				t.Errorf("submit span event %s attribute %s carries the key: %q", ev.Name, kv.Key, kv.Value.String())
			}
		}
	}
}

// TestSubmitTraceparentFromClient: a client sends a huge or malformed
// traceparent (and a huge tracestate). What Submit stores in Task.Trace is
// a well-formed W3C traceparent of 55 bytes, never the client's text; an
// attempt reading a garbage Task.Trace (written by anything) starts a new
// trace.
func TestSubmitTraceparentFromClient(t *testing.T) {
	b := setup(t, otelpgstore.Config{})
	web, err := otelidem.New(otelidem.Config{MeterProvider: b.MeterProvider, TracerProvider: b.TracerProvider})
	if err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	e.Use(web.Server())
	var stored []string
	e.POST("/v1/x", func(c echo.Context) error {
		_, err := b.rec.Submit(c.Request().Context(), pgstore.NewTask{Kind: "k"},
			func(_ context.Context, nt pgstore.NewTask) (pgstore.Task, error) {
				stored = append(stored, nt.Trace)
				return pgstore.Task{ID: "1"}, nil
			})
		return err
	})
	valid := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	headers := []string{
		strings.Repeat("a", 1<<16),
		"00-" + strings.Repeat("f", 32) + "-" + strings.Repeat("f", 16) + "-01", // all-f ids are valid hex
		"00-00000000000000000000000000000000-b7ad6b7169203331-01",               // zero trace id
		"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",               // forbidden version
		"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-" + strings.Repeat("x", 4096),
		valid + "\x00<script>",
		valid,
	}
	for _, h := range headers {
		req := httptest.NewRequest(http.MethodPost, "/v1/x", nil)
		req.Header.Set("traceparent", h)
		req.Header.Set("tracestate", strings.Repeat("k=v,", 10000))
		e.ServeHTTP(httptest.NewRecorder(), req)
	}
	if len(stored) != len(headers) {
		t.Fatalf("%d submits, want %d", len(stored), len(headers))
	}
	for i, tr := range stored {
		if len(tr) != 55 || strings.ContainsAny(tr, "<\x00x") {
			t.Errorf("header %d: stored trace %q, want a 55-byte traceparent", i, tr)
		}
	}
	if !strings.Contains(stored[len(stored)-1], "0af7651916cd43dd8448eb211c80319c") {
		t.Errorf("a valid traceparent did not continue the caller's trace: stored %q", stored[len(stored)-1])
	}

	h := b.rec.Attempt(func(ctx context.Context, _ pgstore.Task) pgstore.Outcome { return pgstore.Outcome{} })
	for i, tr := range []string{"", strings.Repeat("z", 1<<20), valid + "garbage", "00-zz-zz-zz"} {
		h(context.Background(), pgstore.Task{ID: fmt.Sprint("t", i), Kind: "k", Attempt: 1, Trace: tr})
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
	b := setup(f, otelpgstore.Config{})
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

// TestAttemptSpanLimit: an attempt whose outcome event never comes ends
// its span with the outcome "unknown"; one whose event races the limit
// ends exactly once either way (run with -race).
func TestAttemptSpanLimit(t *testing.T) {
	t.Parallel()
	// A limit of 1 ns fires at once: it races the storing of the attempt too.
	b := setup(t, otelpgstore.Config{AttemptSpanLimit: time.Nanosecond})
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
	wait.For(t, 30*time.Second, "every attempt span ends", func() bool {
		ended = map[string]string{}
		for _, sp := range b.Spans.Ended() {
			id := oteltest.Attr(sp, "idemgate.task.id")
			if _, dup := ended[id]; dup {
				t.Fatalf("span of %s ended twice", id)
			}
			ended[id] = oteltest.Attr(sp, "idemgate.task.outcome")
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
