package pgstore

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

func TestProject(t *testing.T) {
	t.Parallel()
	img := json.RawMessage(`{"url":"https://x/1.png"}`)
	tests := []struct {
		name  string
		given Task
		want  Projection
	}{
		{name: "pending polls", given: Task{ID: "a", State: StatePending},
			want: Projection{TaskID: "a", State: StatePending, PollAfter: pollPending}},
		{name: "running polls and hides partial results", given: Task{ID: "a", State: StateRunning, Results: []json.RawMessage{img}},
			want: Projection{TaskID: "a", State: StateRunning, PollAfter: pollRunning}},
		{name: "retrying polls and hides its last error", given: Task{ID: "a", State: StateRetrying, Error: "timeout", Results: []json.RawMessage{img}},
			want: Projection{TaskID: "a", State: StateRetrying, PollAfter: pollRetrying}},
		{name: "uncertain polls", given: Task{ID: "a", State: StateUncertain, Error: "upstream timeout"},
			want: Projection{TaskID: "a", State: StateUncertain, PollAfter: pollUncertain}},
		{name: "succeeded with results", given: Task{ID: "a", State: StateSucceeded, Results: []json.RawMessage{img}},
			want: Projection{TaskID: "a", State: StateSucceeded, Results: []json.RawMessage{img}}},
		{name: "succeeded leaves out null items", given: Task{ID: "a", State: StateSucceeded, Results: []json.RawMessage{json.RawMessage("null"), img, nil}},
			want: Projection{TaskID: "a", State: StateSucceeded, Results: []json.RawMessage{img}}},
		{name: "succeeded without items fails", given: Task{ID: "a", State: StateSucceeded, Results: []json.RawMessage{}},
			want: Projection{TaskID: "a", State: StateFailed, Error: "no result items"}},
		{name: "succeeded with only nulls fails", given: Task{ID: "a", State: StateSucceeded, Results: []json.RawMessage{json.RawMessage(" null ")}},
			want: Projection{TaskID: "a", State: StateFailed, Error: "no result items"}},
		{name: "failed carries its error, not its partial results", given: Task{ID: "a", State: StateFailed, Error: "quota", Results: []json.RawMessage{img}},
			want: Projection{TaskID: "a", State: StateFailed, Error: "quota"}},
		{name: "failed never has an empty error", given: Task{ID: "a", State: StateFailed},
			want: Projection{TaskID: "a", State: StateFailed, Error: "task failed"}},
		{name: "cancelled is final, without results", given: Task{ID: "a", State: StateCancelled, Error: "cancelled", Results: []json.RawMessage{img}},
			want: Projection{TaskID: "a", State: StateCancelled, Error: "cancelled"}},
		{name: "unknown state keeps the client polling", given: Task{ID: "a", State: "paused"},
			want: Projection{TaskID: "a", State: "paused", PollAfter: pollUncertain}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := Project(tt.given)
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Project = %+v; want %+v", got, tt.want)
			}
			if (got.PollAfter > 0) == (got.State == StateSucceeded || got.State == StateFailed || got.State == StateCancelled) {
				t.Fatalf("PollAfter %v in state %s", got.PollAfter, got.State)
			}
		})
	}
}

func TestPollAfterAt(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name  string
		given Task
		want  time.Duration
	}{
		{"pending, runs now", Task{State: StatePending, RunAfter: now.Add(-time.Minute)}, pollPending},
		{"pending, scheduled in 10 minutes", Task{State: StatePending, RunAfter: now.Add(10 * time.Minute)}, 10 * time.Minute},
		{"pending, scheduled within the poll interval", Task{State: StatePending, RunAfter: now.Add(time.Millisecond)}, pollPending},
		{"retrying, backoff of a minute", Task{State: StateRetrying, RunAfter: now.Add(time.Minute)}, time.Minute},
		{"running: run_after is not a schedule", Task{State: StateRunning, RunAfter: now.Add(time.Hour)}, pollRunning},
		{"uncertain: run_after is the reconcile's", Task{State: StateUncertain, RunAfter: now.Add(time.Hour)}, pollUncertain},
		{"succeeded: no polling", Task{State: StateSucceeded, Results: []json.RawMessage{json.RawMessage(`1`)}, RunAfter: now.Add(time.Hour)}, 0},
		{"cancelled: no polling", Task{State: StateCancelled, RunAfter: now.Add(time.Hour)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Project(tt.given).PollAfterAt(now); got != tt.want {
				t.Fatalf("PollAfterAt = %v, want %v", got, tt.want)
			}
		})
	}
}
