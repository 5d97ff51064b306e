package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// TestPartitionedWorkerMakesOneUpstreamCall runs two workers, each on a
// pool of its own behind a TCP proxy, and freezes the proxy of the one
// running the task mid-attempt. The frozen worker's handler must be
// cancelled (by its own clock) before the other worker may take the
// task, and the upstream is called once.
func TestPartitionedWorkerMakesOneUpstreamCall(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	var (
		upstream    atomic.Int64 // upstream calls made
		cancelledAt atomic.Int64 // wall clock (ns) when the first attempt's context ended
		entered     = make(chan int, 2)
	)
	handler := func(worker int) Handler {
		return func(ctx context.Context, t Task) Outcome {
			upstream.Add(1)
			entered <- worker
			<-ctx.Done()
			cancelledAt.CompareAndSwap(0, time.Now().UnixNano())
			return Retry(0, context.Cause(ctx))
		}
	}
	cfg := func(worker int) WorkerConfig {
		return WorkerConfig{Name: []string{"a", "b"}[worker], Lease: 2 * time.Second, Heartbeat: 400 * time.Millisecond,
			ReconcileInterval: 100 * time.Millisecond, Policies: map[string]KindPolicy{"image": {Lost: LostUncertain}},
			RescueInterval: 100 * time.Millisecond, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
			ShutdownTimeout: 200 * time.Millisecond, Handler: handler(worker),
			Reconcile: func(ctx context.Context, t Task) Outcome {
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
	pools, proxies := [2]*Store{}, [2]*tcpProxy{}
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
	proxies[0].freeze()
	runWorker(t, newWorker(t, pools[1], cfg(1)))

	waitFor(t, func() bool {
		st := state(t, s, task.ID)
		return st == StateSucceeded || st == StateFailed || upstream.Load() > 1
	})
	if n := upstream.Load(); n != 1 {
		t.Fatalf("the upstream was called %d times; want once", n)
	}
	// When was the task taken from a, by the database's clock (one host)?
	var takenAt time.Time
	if err := s.pool.QueryRow(context.Background(), `SELECT min(at) FROM idemgate_test_transitions WHERE id = $1::uuid`, task.ID).Scan(&takenAt); err != nil {
		t.Fatal(err)
	}
	c := cancelledAt.Load()
	if c == 0 || !time.Unix(0, c).Before(takenAt) {
		t.Fatalf("a's handler was cancelled at %v, the task taken from it at %v; want cancelled first", time.Unix(0, c), takenAt)
	}
}
