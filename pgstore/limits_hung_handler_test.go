//go:build review

package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/wait"
)

// MaxRunning bounds the upstream's load. A handler that ignores its
// context past its Timeout (a blocking call without a context) still
// occupies its worker's slot (runAttempt waits for it), but its task was
// written off and no longer counts in the database: another attempt of
// the kind starts while it still runs.
func TestReviewMaxRunningCountsHandlersThatIgnoreTimeout(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	ctx := context.Background()
	if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunning: 1}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		mustSubmit(t, s, newTask(fmt.Sprintf("hung-%d", i)))
	}
	var live, most atomic.Int64
	h := func(context.Context, Task) Outcome {
		n := live.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(1500 * time.Millisecond) // ignores ctx
		live.Add(-1)
		return Succeeded(json.RawMessage(`1`))
	}
	for range 2 {
		runWorker(t, newWorker(t, newStore(db.pool(t)), WorkerConfig{Concurrency: 2, Handler: h,
			Heartbeat: 100 * time.Millisecond, Policies: map[string]KindPolicy{"image": {Timeout: 300 * time.Millisecond}}}))
	}
	wait.For(t, patience, "no task left pending", func() bool {
		return countRows(t, s.pool, "state IN ('pending', 'running')") == 0 && live.Load() == 0
	})
	if m := most.Load(); m > 1 {
		t.Fatalf("%d handlers of the kind ran at once; MaxRunning is 1", m)
	}
}
