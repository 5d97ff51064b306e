package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/wait"
)

// MaxRunning and MaxRunningPerTenant hold while six workers on pools
// whose transactions default to SERIALIZABLE and REPEATABLE READ (three
// of each) race for the slots, with Submits of the same kind arriving
// from a SERIALIZABLE pool meanwhile: the claim runs under READ
// COMMITTED whatever the default, and each task runs exactly once.
func TestKindLimitsHoldWithWorkersOfSerializableAndRepeatableReadPools(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	ctx := hangBound(t)
	attemptLog(t, s.pool)
	const maxRunning, perTenant, tasks = 3, 1, 90
	if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunning: maxRunning, MaxRunningPerTenant: perTenant,
		StartsPerSecond: 1000}); err != nil {
		t.Fatal(err)
	}
	submitter := db.storeAt(t, "serializable")
	cfg := WorkerConfig{Concurrency: 4, Lease: 5 * time.Second, Heartbeat: time.Second,
		RescueInterval: 100 * time.Millisecond, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
		Handler: func(ctx context.Context, _ Task) Outcome {
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Millisecond):
			}
			return Succeeded(json.RawMessage(`1`))
		}}
	for i := range 6 {
		level := isolationLevels[1+i%2]
		runWorker(t, newWorker(t, db.storeAt(t, level), cfg))
	}
	for i := range tasks {
		if _, err := submitter.Submit(ctx, tenantTask(fmt.Sprintf("tenant-%d", i%5), fmt.Sprintf("k%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	wait.For(t, patience, "every task succeeded", func() bool {
		return countRows(t, s.pool, "state = 'succeeded'") == tasks
	})
	ivs := attemptIntervals(t, s.pool)
	if got := maxOverlap(ivs, ""); got > maxRunning {
		t.Fatalf("%d attempts held a lease at once; want ≤ MaxRunning %d", got, maxRunning)
	}
	for i := range 5 {
		if got := maxOverlap(ivs, fmt.Sprintf("tenant-%d", i)); got > perTenant {
			t.Fatalf("tenant-%d had %d attempts at once; want ≤ MaxRunningPerTenant %d", i, got, perTenant)
		}
	}
	if len(ivs) != tasks {
		t.Fatalf("%d attempts for %d tasks; want one each", len(ivs), tasks)
	}
	t.Logf("%d attempts; at most %d at once", len(ivs), maxOverlap(ivs, ""))
}
