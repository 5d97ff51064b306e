package otelpgstore_test

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/idemgate/idemgate/internal/wait"
	"github.com/idemgate/idemgate/otelidem/internal/sdktest/oteltest"
	"github.com/idemgate/idemgate/otelidem/otelpgstore"
	"github.com/idemgate/idemgate/pgstore"
)

// TestLimitMetrics sets kind limits on a real database and reads them
// back as gauges, then runs a worker against them: every claim the limits
// held back is counted (and none as an attempt), and a change of the
// limits shows at the next collection.
func TestLimitMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t, otelpgstore.Config{})
	s, _ := newStore(t)
	ctx := context.Background()
	if err := s.SetKindLimits(ctx, "image", pgstore.KindLimits{MaxRunning: 1, MaxRunningPerTenant: 1, StartsPerSecond: 2.5}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetKindLimits(ctx, "music", pgstore.KindLimits{Paused: true}); err != nil {
		t.Fatal(err)
	}
	unregister, err := b.rec.ObserveTasks(s, "video") // a kind with neither tasks nor limits
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unregister() })

	kind := func(k string) attribute.KeyValue { return attribute.String("idemgate.task.kind", k) }
	succeeded := attribute.String("idemgate.task.outcome", "succeeded")
	rm := b.Collect(t)
	for _, c := range []struct {
		name, kind string
		want       float64
	}{
		{"idemgate.task.limit.max_running", "image", 1},
		{"idemgate.task.limit.max_running_per_tenant", "image", 1},
		{"idemgate.task.limit.starts", "image", 2.5},
		{"idemgate.task.paused", "image", 0},
		{"idemgate.task.paused", "music", 1},
		{"idemgate.task.paused", "video", 0},
		{"idemgate.task.limit.usage", "image", 0},
		{"idemgate.task.limit.usage", "video", 0},
	} {
		if got := oteltest.Value(t, rm, c.name, kind(c.kind)); got != c.want {
			t.Errorf("%s{%s} = %v, want %v", c.name, c.kind, got, c.want)
		}
	}
	// An unset limit has no point (not 0, which would read as "nothing may run").
	for _, name := range []string{"idemgate.task.limit.max_running", "idemgate.task.limit.max_running_per_tenant", "idemgate.task.limit.starts"} {
		for _, set := range oteltest.Points(rm, name) {
			if k, _ := set.Value("idemgate.task.kind"); k.AsString() != "image" {
				t.Errorf("%s has a point for %s, which has no such limit", name, k.AsString())
			}
		}
	}

	// Three image tasks of one tenant, one music task: MaxRunning 1 lets
	// one image attempt run while the handler blocks; the paused music
	// task waits. Claims in the meantime are held back.
	for _, nt := range []pgstore.NewTask{newTask("i1"), newTask("i2"), newTask("i3"), newTask("m1")} {
		if nt.IdempotencyKey == "m1" {
			nt.Kind = "music"
		}
		if _, err := s.Submit(ctx, nt); err != nil {
			t.Fatal(err)
		}
	}
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	var running, maxRunning, heldImage, heldMusic atomic.Int64
	w, err := pgstore.NewWorker(s, pgstore.WorkerConfig{
		Handler: b.rec.Attempt(func(ctx context.Context, task pgstore.Task) pgstore.Outcome {
			n := running.Add(1)
			defer running.Add(-1)
			for m := maxRunning.Load(); n > m && !maxRunning.CompareAndSwap(m, n); m = maxRunning.Load() {
			}
			if task.Kind == "image" {
				<-release
			}
			return pgstore.Succeeded(json.RawMessage(`"done"`))
		}),
		OnEvent: func(ev pgstore.WorkerEvent) {
			if ev.Type == pgstore.WorkerHeldBack {
				map[string]*atomic.Int64{"image": &heldImage, "music": &heldMusic}[ev.Kind].Add(1)
			}
			b.rec.OnWorkerEvent(ev)
		},
		Concurrency:    4,
		Lease:          5 * time.Second,
		PollInterval:   20 * time.Millisecond,
		RescueInterval: time.Second,
		BackoffBase:    time.Millisecond,
		BackoffMax:     time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.Run(runCtx)
	}()
	t.Cleanup(func() {
		unblock()
		cancel()
		<-done
	})
	wait.For(t, 30*time.Second, "claims of both kinds held back", func() bool {
		return heldImage.Load() >= 2 && heldMusic.Load() >= 2
	})
	// One image attempt holds its slot while its handler blocks: the usage
	// beside MaxRunning 1.
	if got := oteltest.Value(t, b.Collect(t), "idemgate.task.limit.usage", kind("image")); got != 1 {
		t.Errorf("idemgate.task.limit.usage{image} = %v while one attempt runs, want 1", got)
	}
	unblock()
	wait.For(t, 30*time.Second, "the image tasks finish", func() bool {
		rm := b.Collect(t)
		return oteltest.Has(rm, "idemgate.task.attempts") &&
			oteltest.Count(t, rm, "idemgate.task.attempts", kind("image"), succeeded) >= 3
	})
	if got := maxRunning.Load(); got != 1 {
		t.Errorf("%d attempts ran at once, want 1 (MaxRunning)", got)
	}

	// Resume music; lift image's limits.
	if err := s.SetKindLimits(ctx, "music", pgstore.KindLimits{}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetKindLimits(ctx, "image", pgstore.KindLimits{}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "the music task runs once resumed", func() bool {
		return oteltest.Count(t, b.Collect(t), "idemgate.task.attempts", kind("music"), succeeded) >= 1
	})
	cancel()
	<-done

	rm = b.Collect(t)
	for k, want := range map[string]int64{"image": heldImage.Load(), "music": heldMusic.Load()} {
		if got := oteltest.Count(t, rm, "idemgate.task.held_back", kind(k)); got != want {
			t.Errorf("idemgate.task.held_back{%s} = %d, want the worker's %d events", k, got, want)
		}
	}
	for k, want := range map[string]int64{"image": 3, "music": 1} {
		if got := oteltest.Count(t, rm, "idemgate.task.attempts", kind(k)); got != want {
			t.Errorf("idemgate.task.attempts{%s} = %d, want %d: a held-back claim is not an attempt", k, got, want)
		}
	}
	if got := oteltest.Count(t, rm, "idemgate.task.attempts", attribute.String("idemgate.task.outcome", "held_back")); got != 0 {
		t.Errorf("idemgate.task.attempts{held_back} = %d, want 0", got)
	}
	if got := oteltest.Value(t, rm, "idemgate.task.paused", kind("music")); got != 0 {
		t.Errorf("idemgate.task.paused{music} = %v after resume, want 0", got)
	}
	for _, name := range []string{"idemgate.task.limit.max_running", "idemgate.task.limit.max_running_per_tenant", "idemgate.task.limit.starts"} {
		if pts := oteltest.Points(rm, name); len(pts) != 0 {
			t.Errorf("%s has %d points after the limits were lifted, want none", name, len(pts))
		}
	}
}
