package pgstore

import (
	"encoding/json"
	"reflect"
	"testing"
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
