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

// An operator (or a script) flips a kind between paused and MaxRunning 2
// while four workers on separate pools claim. Nothing runs while paused,
// and at most 2 run otherwise, so no instant may see more than 2
// attempts. The paused-only row takes no advisory lock in
// sqlLockLimitedKinds, but the claim statement (a new snapshot) may read
// MaxRunning 2 committed in between: two such claims count room
// concurrently.
func TestReviewLimitsHoldWhilePauseFlipsToMaxRunning(t *testing.T) {
	t.Parallel()
	s, db := setup(t)
	ctx := context.Background()
	attemptLog(t, s.pool)
	const maxRunning = 2
	if err := s.SetKindLimits(ctx, "image", KindLimits{Paused: true}); err != nil {
		t.Fatal(err)
	}
	var batch []NewTask
	for i := range 400 {
		batch = append(batch, tenantTask(fmt.Sprintf("t-%d", i%7), fmt.Sprintf("flip-%d", i)))
	}
	if _, err := s.SubmitMany(ctx, batch); err != nil {
		t.Fatal(err)
	}
	var live, most atomic.Int64
	cfg := WorkerConfig{Concurrency: 8, PollInterval: 5 * time.Millisecond,
		Handler: func(context.Context, Task) Outcome {
			n := live.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(3 * time.Millisecond)
			live.Add(-1)
			return Succeeded(json.RawMessage(`1`))
		}}
	for range 4 {
		runWorker(t, newWorker(t, newStore(db.pool(t)), cfg))
	}
	stop := make(chan struct{})
	flips := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				flips <- n
				return
			default:
			}
			l := KindLimits{Paused: true}
			if n%2 == 0 {
				l = KindLimits{MaxRunning: maxRunning}
			}
			if err := s.SetKindLimits(ctx, "image", l); err != nil {
				t.Error(err)
			}
			n++
			time.Sleep(time.Duration(n%4) * time.Millisecond)
		}
	}()
	ok := wait.Until(60*time.Second, func() bool { return countRows(t, s.pool, "state = 'succeeded'") >= 300 })
	close(stop)
	n := <-flips
	ivs := attemptIntervals(t, s.pool)
	t.Logf("%d flips, %d attempts, at most %d leases at once (db), %d handlers at once", n, len(ivs), maxOverlap(ivs, ""), most.Load())
	if !ok {
		t.Fatalf("only %d of 400 succeeded in 60s", countRows(t, s.pool, "state = 'succeeded'"))
	}
	if got := maxOverlap(ivs, ""); got > maxRunning {
		t.Fatalf("%d attempts held a lease at once; MaxRunning is %d and paused means none start", got, maxRunning)
	}
	if m := most.Load(); m > maxRunning {
		t.Fatalf("%d handlers ran at once; want ≤ %d", m, maxRunning)
	}
}
