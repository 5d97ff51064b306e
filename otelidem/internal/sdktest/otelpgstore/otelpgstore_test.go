package otelpgstore_test

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/internal/wait"
	"github.com/idemgate/idemgate/otelidem/internal/sdktest/oteltest"
	"github.com/idemgate/idemgate/otelidem/otelpgstore"
	"github.com/idemgate/idemgate/pgstore"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// bundle is a Recorder on an SDK that the test reads.
type bundle struct {
	rec *otelpgstore.Recorder
	*oteltest.SDK
}

func setup(t testing.TB, cfg otelpgstore.Config) *bundle {
	t.Helper()
	sdk := oteltest.New(t)
	cfg.MeterProvider, cfg.TracerProvider = sdk.MeterProvider, sdk.TracerProvider
	rec, err := otelpgstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{rec: rec, SDK: sdk}
}

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
func runWorker(t *testing.T, s *pgstore.Store, rec *otelpgstore.Recorder) {
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

// TestTaskMetrics submits two tasks, one of which a dead worker had
// claimed, and reads the task instruments: counts by state before and
// after, the oldest runnable age, claims, attempts and the rescue.
func TestTaskMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t, otelpgstore.Config{})
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
	rm := b.Collect(t)
	for _, c := range []struct {
		state string
		want  float64
	}{{"pending", 1}, {"running", 1}, {"retrying", 0}, {"uncertain", 0}} {
		if got := oteltest.Value(t, rm, "idemgate.tasks", kind, state(c.state)); got != c.want {
			t.Errorf("before: idemgate.tasks{%s} = %v, want %v", c.state, got, c.want)
		}
	}
	if got := oteltest.Value(t, rm, "idemgate.tasks", attribute.String("idemgate.task.kind", "music"), state("pending")); got != 0 {
		t.Errorf("idemgate.tasks{music,pending} = %v, want 0", got)
	}
	if got := oteltest.Value(t, rm, "idemgate.task.oldest.age", attribute.String("idemgate.task.queue", "runnable")); got <= 0 {
		t.Errorf("oldest runnable age = %v, want > 0 with a pending task", got)
	}
	if got := oteltest.Value(t, rm, "idemgate.task.oldest.age", attribute.String("idemgate.task.queue", "uncertain")); got != 0 {
		t.Errorf("oldest uncertain age = %v, want 0 with none", got)
	}

	runWorker(t, s, b.rec)
	succeeded := attribute.String("idemgate.task.outcome", "succeeded")
	wait.For(t, 30*time.Second, "both tasks succeed", func() bool {
		rm := b.Collect(t)
		return oteltest.Has(rm, "idemgate.task.attempts") && oteltest.Count(t, rm, "idemgate.task.attempts", kind, succeeded) == 2
	})
	for _, id := range []string{ok.ID, dead.ID} {
		got, err := s.Get(ctx, "acme", "owner-a", id)
		if err != nil || got.State != pgstore.StateSucceeded {
			t.Fatalf("task %s: %s %v", id, got.State, err)
		}
	}

	rm = b.Collect(t)
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
		if c.want > 0 || oteltest.Has(rm, c.name) {
			got = oteltest.Count(t, rm, c.name, kind)
		}
		if got != c.want {
			t.Errorf("%s = %d, want %d", c.name, got, c.want)
		}
	}
	for _, st := range []string{"pending", "running", "retrying", "uncertain"} {
		if got := oteltest.Value(t, rm, "idemgate.tasks", kind, state(st)); got != 0 {
			t.Errorf("after: idemgate.tasks{%s} = %v, want 0", st, got)
		}
	}

	// Each attempt span joined its submit's trace and ended with its outcome.
	submits := map[string]sdktrace.ReadOnlySpan{}
	attempts := map[string]sdktrace.ReadOnlySpan{}
	for _, sp := range b.Spans.Ended() {
		id := oteltest.Attr(sp, "idemgate.task.id")
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
		if got := oteltest.Attr(att, "idemgate.task.outcome"); got != "succeeded" {
			t.Errorf("task %s: attempt outcome %q", id, got)
		}
	}
	if got := oteltest.Attr(attempts[dead.ID], "idemgate.task.attempt"); got != "2" {
		t.Errorf("rescued task's attempt span has attempt %s, want 2", got)
	}
}
