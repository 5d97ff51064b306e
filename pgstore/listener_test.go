package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/wait"
)

// a task announced by no NOTIFY of its own (its Submit fell in
// a burst's rate-limit window) is claimed a recheck window after the
// burst's last notification, not at the next poll.
func TestNoLostWakeUpAfterABurst(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	w := newWorker(t, s, WorkerConfig{PollInterval: time.Hour, Handler: func(context.Context, Task) Outcome {
		return Succeeded(json.RawMessage(`1`))
	}})
	// A wide window, so that the sleeps below can overrun a lot.
	const window = 2 * time.Second
	w.listener.recheck = window
	runWorker(t, w)
	wait.For(t, patience, "the worker listens and is idle", func() bool {
		return countActivity(t, s.pool, listening) == 1 && w.claims.Load() >= 2
	})
	ctx := context.Background()
	notify := func() {
		if _, err := s.pool.Exec(ctx, "SELECT pg_notify($1, 'image')", notifyChannel); err != nil {
			t.Fatal(err)
		}
	}
	// The quiet task must commit after the first notification's recheck
	// and before the last one's. A loaded machine can overrun the sleeps
	// past the last recheck; such an attempt proves nothing and is run
	// again (its task is claimed by the next attempt's notifications).
	for attempt := 1; ; attempt++ {
		notify()
		time.Sleep(window / 2)
		last := time.Now()
		notify() // the burst's last announcement
		time.Sleep(window/2 + window/6)
		var id string
		if err := s.pool.QueryRow(ctx, `INSERT INTO idemgate_tasks
			(tenant, owner, kind, runtime, network, idempotency_key, fingerprint)
			VALUES ('acme', 'o', 'image', 'gpu', 'main', $1, 'f') RETURNING id::text`,
			fmt.Sprintf("quiet-%d", attempt)).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if late := time.Since(last); late >= window {
			if attempt == 5 {
				t.Skipf("the machine overran every attempt's sleeps (last by %v); nothing was shown", late-window)
			}
			t.Logf("attempt %d: the insert landed %v after the last notification's recheck; again", attempt, late-window)
			continue
		}
		// The recheck is due within window; the poll interval is an hour.
		deadline := time.Now().Add(time.Minute)
		for state(t, s, id) != StateSucceeded {
			if time.Now().After(deadline) {
				t.Fatal("the task waited for the poll interval: a wake-up was lost")
			}
			time.Sleep(10 * time.Millisecond)
		}
		return
	}
}
