package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/idemgate/idemgate/internal/wait"
)

// events collects WorkerEvents from many goroutines.
type events struct {
	mu  sync.Mutex
	all []WorkerEvent
}

func (e *events) add(ev WorkerEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
}

// of returns the types of the events of task id, in order.
func (e *events) of(id string) []WorkerEventType {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []WorkerEventType
	for _, ev := range e.all {
		if ev.TaskID == id {
			out = append(out, ev.Type)
		}
	}
	return out
}

func TestWorkerEvents(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	var got events
	w := newWorker(t, s, WorkerConfig{OnEvent: got.add, MaxAttempts: 1,
		Handler: func(ctx context.Context, t Task) Outcome {
			if t.IdempotencyKey == "fails" {
				return Failed(errors.New("refused"))
			}
			return Succeeded(json.RawMessage(`1`))
		}})
	runWorker(t, w)
	ok := mustSubmit(t, s, newTask("ok"))
	fails := mustSubmit(t, s, newTask("fails"))
	waitState(t, s, ok.ID, StateSucceeded)
	waitState(t, s, fails.ID, StateFailed)
	tests := []struct {
		name string
		id   string
		want []WorkerEventType
	}{
		{name: "success", id: ok.ID, want: []WorkerEventType{WorkerClaimed, WorkerSucceeded}},
		{name: "failure", id: fails.ID, want: []WorkerEventType{WorkerClaimed, WorkerFailed}},
	}
	for _, tt := range tests {
		wait.For(t, patience, "every event of the task", func() bool { return len(got.of(tt.id)) == len(tt.want) })
		for i, typ := range got.of(tt.id) {
			if typ != tt.want[i] {
				t.Errorf("%s: events %v; want %v", tt.name, got.of(tt.id), tt.want)
				break
			}
		}
	}
	got.mu.Lock()
	defer got.mu.Unlock()
	for _, ev := range got.all {
		if ev.Kind != "image" || ev.Attempt != 1 {
			t.Errorf("event %+v; want kind image, attempt 1", ev)
		}
		if ev.Type == WorkerFailed && (ev.Err == nil || ev.Err.Error() != "refused") {
			t.Errorf("failed event carries %v; want the handler's error", ev.Err)
		}
	}
}
