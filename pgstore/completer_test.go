package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/wait"
)

// Results Postgres cannot hold however they are escaped (nested deeper
// than its parser goes) are recorded as a failure, once.
func TestResultsTooDeepAreRecordedAsAFailure(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	var c calls
	const depth = 9000 // json.Valid allows 10000
	deep := json.RawMessage(strings.Repeat("[", depth) + strings.Repeat("]", depth))
	if !json.Valid(deep) {
		t.Fatal("the test's JSON is not valid")
	}
	w := newWorker(t, s, WorkerConfig{MaxAttempts: 3, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
		Handler: func(ctx context.Context, t Task) Outcome {
			c.add(t.ID)
			return Succeeded(deep)
		}})
	runWorker(t, w)
	task := mustSubmit(t, s, newTask("deep"))
	if !wait.Until(patience, func() bool { st := state(t, s, task.ID); return st == StateSucceeded || st == StateFailed }) {
		t.Fatalf("task is %s; want it finished", state(t, s, task.ID))
	}
	if n := c.get(task.ID); n != 1 {
		t.Fatalf("handler ran %d times; want once", n)
	}
	t.Logf("deep results ended %s: %q", state(t, s, task.ID), mustGet(t, s, task).Error)
}

// outcomes Postgres refuses as such (NUL in text, \u0000 in
// jsonb) are stored sanitized, once; the task does not run again.
func TestOutcomesPostgresRefusesAreRecorded(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	var c calls
	// A lease long enough that no attempt is lost on a loaded machine:
	// each task must run exactly once.
	w := newWorker(t, s, WorkerConfig{Lease: 10 * time.Second, Heartbeat: 2 * time.Second,
		RescueInterval: 50 * time.Millisecond, MaxAttempts: 2, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
		Handler: func(ctx context.Context, t Task) Outcome {
			c.add(t.ID)
			switch t.IdempotencyKey {
			case "nul-error":
				return Failed(errors.New("upstream said \x00 bad \xff bytes"))
			case "nul-retry":
				return Retry(time.Hour, errors.New("busy\x00"))
			default:
				return Succeeded(json.RawMessage(`{"text":"a\u0000b","bad":"\ud800"}`))
			}
		}})
	runWorker(t, w)
	failed := mustSubmit(t, s, newTask("nul-error"))
	retried := mustSubmit(t, s, newTask("nul-retry"))
	succeeded := mustSubmit(t, s, newTask("nul-result"))
	waitState(t, s, failed.ID, StateFailed)
	waitState(t, s, retried.ID, StateRetrying)
	waitState(t, s, succeeded.ID, StateSucceeded)
	for _, task := range []Task{failed, retried, succeeded} {
		if n := c.get(task.ID); n != 1 {
			t.Errorf("task %s ran %d times; want once", task.IdempotencyKey, n)
		}
	}
	if got := mustGet(t, s, failed); !strings.Contains(got.Error, "upstream said") || !strings.Contains(got.Error, "bad") {
		t.Errorf("failed task's error %q; want the handler's error, sanitized", got.Error)
	}
	if got := mustGet(t, s, retried); !strings.Contains(got.Error, "busy") {
		t.Errorf("retried task's error %q; want the handler's error, sanitized", got.Error)
	}
	got := mustGet(t, s, succeeded)
	var item struct{ Text, Bad string }
	if len(got.Results) != 1 || json.Unmarshal(got.Results[0], &item) != nil || !strings.HasPrefix(item.Text, "a") || !strings.HasSuffix(item.Text, "b") {
		t.Errorf("succeeded task's results %s; want the item, sanitized", got.Results)
	}
}
