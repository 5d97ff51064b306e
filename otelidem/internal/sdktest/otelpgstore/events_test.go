package otelpgstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/idemgate/idemgate/otelidem/internal/sdktest/oteltest"
	"github.com/idemgate/idemgate/otelidem/otelpgstore"
	"github.com/idemgate/idemgate/pgstore"
)

// TestConcurrentRecording runs attempts and worker events from many
// goroutines at once (run it with -race): every attempt span ends once,
// with its own outcome, and every event is counted.
func TestConcurrentRecording(t *testing.T) {
	t.Parallel()
	b := setup(t, otelpgstore.Config{})
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
			}
		})
	}
	wg.Wait()
	rm := b.Collect(t)
	for _, o := range outcomes {
		if got := oteltest.Count(t, rm, "idemgate.task.attempts", attribute.String("idemgate.task.outcome", string(o))); got != int64(goroutines*each/len(outcomes)) {
			t.Errorf("attempts{%s} = %d, want %d", o, got, goroutines*each/len(outcomes))
		}
	}
	ended := map[string]string{}
	for _, sp := range b.Spans.Ended() {
		if sp.Name() != "idemgate.task.attempt" {
			continue
		}
		id := oteltest.Attr(sp, "idemgate.task.id")
		if _, dup := ended[id]; dup {
			t.Errorf("attempt span of %s ended twice", id)
		}
		ended[id] = oteltest.Attr(sp, "idemgate.task.outcome")
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

// BenchmarkOnWorkerEvent is the cost of one attempt's outcome metrics.
func BenchmarkOnWorkerEvent(b *testing.B) {
	bu := setup(b, otelpgstore.Config{})
	ev := pgstore.WorkerEvent{Type: pgstore.WorkerSucceeded, Kind: "images", TaskID: "t", Attempt: 1, Latency: time.Second}
	b.ReportAllocs()
	for b.Loop() {
		bu.rec.OnWorkerEvent(ev)
	}
}

// TestWorkerEventsThatEndNoAttempt: claims, rescues, outcome retries,
// held-back claims and event types this package does not know (a newer
// pgstore's) are not counted as attempts, and leave an attempt's span
// open until its own outcome arrives.
func TestWorkerEventsThatEndNoAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, otelpgstore.Config{})
	h := b.rec.Attempt(func(ctx context.Context, task pgstore.Task) pgstore.Outcome {
		return pgstore.Succeeded(json.RawMessage(`1`))
	})
	h(context.Background(), pgstore.Task{ID: "t", Kind: "image", Attempt: 1})
	for _, typ := range []pgstore.WorkerEventType{pgstore.WorkerClaimed, pgstore.WorkerRescued, pgstore.WorkerOutcomeRetry,
		pgstore.WorkerHeldBack, "from_a_newer_pgstore"} {
		b.rec.OnWorkerEvent(pgstore.WorkerEvent{Type: typ, Kind: "image", TaskID: "t", Attempt: 1})
	}
	if spans := b.Spans.Ended(); len(spans) != 0 {
		t.Fatalf("spans %v ended before the attempt's outcome", oteltest.Names(spans))
	}
	rm := b.Collect(t)
	if oteltest.Has(rm, "idemgate.task.attempts") {
		t.Errorf("idemgate.task.attempts counted %d attempts, want none", oteltest.Count(t, rm, "idemgate.task.attempts"))
	}
	if got := oteltest.Count(t, rm, "idemgate.task.held_back", attribute.String("idemgate.task.kind", "image")); got != 1 {
		t.Errorf("idemgate.task.held_back{image} = %d, want 1", got)
	}
	b.rec.OnWorkerEvent(pgstore.WorkerEvent{Type: pgstore.WorkerSucceeded, Kind: "image", TaskID: "t", Attempt: 1})
	if spans := b.Spans.Ended(); len(spans) != 1 || oteltest.Attr(spans[0], "idemgate.task.outcome") != "succeeded" {
		t.Errorf("spans %v, want the attempt's, ended succeeded", oteltest.Names(spans))
	}
}
