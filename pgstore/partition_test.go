package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/proxy"
)

// TestPartitionedWorkerMakesOneUpstreamCall runs two workers, each on a
// pool of its own behind a TCP proxy, and freezes the proxy of the one
// running the task mid-attempt (its heartbeats, its listener, every new
// connection: all silent, nothing reset). The frozen worker's handler
// must be cancelled by its own clock, because it can no longer confirm
// its lease, before the other worker may take the task; with the
// uncertain policy the other worker reconciles instead of calling the
// upstream again, so the upstream is called once. With the retry policy
// the other worker runs the task again, as that policy asks, but still
// only after the frozen attempt was cancelled.
func TestPartitionedWorkerMakesOneUpstreamCall(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		lost          LostPolicy
		wantUpstream  int64
		wantReconcile bool
	}{
		{name: "uncertain + reconcile: one upstream call", lost: LostUncertain, wantUpstream: 1, wantReconcile: true},
		{name: "retry: run again, after the cut-off attempt stopped", lost: LostRetry, wantUpstream: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			testPartition(t, tt.lost, tt.wantUpstream, tt.wantReconcile)
		})
	}
}

func testPartition(t *testing.T, lost LostPolicy, wantUpstream int64, wantReconcile bool) {
	s, db := setup(t)
	var (
		upstream    atomic.Int64 // upstream calls made
		reconciled  atomic.Int64
		cancelledAt atomic.Int64 // wall clock (ns) when the frozen attempt's context ended
		cause       = make(chan error, 1)
		entered     = make(chan int, 2)
	)
	handler := func(worker int) Handler {
		return func(ctx context.Context, t Task) Outcome {
			upstream.Add(1)
			entered <- worker
			if worker == 1 {
				return Succeeded(json.RawMessage(`"ran again"`))
			}
			<-ctx.Done()
			cancelledAt.Store(time.Now().UnixNano())
			cause <- context.Cause(ctx)
			return Retry(0, context.Cause(ctx))
		}
	}
	cfg := func(worker int) WorkerConfig {
		// The check below needs a's own deadline (the lease less a tenth)
		// to pass before b's rescue (the lease and a tenth): a fifth of the
		// lease apart, 1 s. With a 2 s lease, a loaded machine (load 30)
		// ran a's timer 3 s late.
		return WorkerConfig{Name: []string{"a", "b"}[worker], Lease: 5 * time.Second, Heartbeat: time.Second,
			ReconcileInterval: 100 * time.Millisecond, Policies: map[string]KindPolicy{"image": {Lost: lost}},
			RescueInterval: 100 * time.Millisecond, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
			ShutdownTimeout: 200 * time.Millisecond, Handler: handler(worker),
			Reconcile: func(ctx context.Context, t Task) Outcome {
				reconciled.Add(1)
				if upstream.Load() > 0 { // the stand-in upstream knows it ran
					return Succeeded(json.RawMessage(`"reconciled"`))
				}
				return Retry(0, errors.New("never reached the upstream"))
			}}
	}
	// Record when a running task leaves running, by the database's clock.
	if _, err := s.pool.Exec(context.Background(), `CREATE TABLE idemgate_test_transitions (id uuid, at timestamptz);
CREATE FUNCTION idemgate_test_left_running() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO idemgate_test_transitions VALUES (NEW.id, clock_timestamp());
	RETURN NEW;
END $$;
CREATE TRIGGER left_running AFTER UPDATE ON idemgate_tasks FOR EACH ROW
	WHEN (OLD.state = 'running' AND NEW.state <> 'running') EXECUTE FUNCTION idemgate_test_left_running();`); err != nil {
		t.Fatal(err)
	}
	pools, proxies := [2]*Store{}, [2]*proxy.Proxy{}
	for i := range 2 {
		p, px := db.poolVia(t)
		pools[i], proxies[i] = newStore(p), px
	}
	// Only worker a runs at first, so that it takes the task.
	runWorker(t, newWorker(t, pools[0], cfg(0)))
	task := mustSubmit(t, s, newTask("partitioned"))
	if w := <-entered; w != 0 {
		t.Fatalf("worker %d took the task; want a", w)
	}
	proxies[0].Set(proxy.Freeze, 0)
	runWorker(t, newWorker(t, pools[1], cfg(1)))

	waitState(t, s, task.ID, StateSucceeded)
	if n := upstream.Load(); n != wantUpstream {
		t.Fatalf("the upstream was called %d times; want %d", n, wantUpstream)
	}
	if got := reconciled.Load() > 0; got != wantReconcile {
		t.Fatalf("reconciled: %v; want %v", got, wantReconcile)
	}
	select {
	case err := <-cause:
		if !errors.Is(err, errLeaseExpired) {
			t.Fatalf("the frozen attempt's context ended by %v; want its own lease deadline", err)
		}
	default:
		t.Fatal("the frozen attempt's context was never cancelled")
	}
	// When was the task taken from a, by the database's clock (one host)?
	var takenAt time.Time
	if err := s.pool.QueryRow(context.Background(), `SELECT min(at) FROM idemgate_test_transitions WHERE id = $1::uuid`, task.ID).Scan(&takenAt); err != nil {
		t.Fatal(err)
	}
	if c := time.Unix(0, cancelledAt.Load()); !c.Before(takenAt) {
		t.Fatalf("a's handler was cancelled at %v, the task taken from it at %v; want cancelled first", c, takenAt)
	}
}
