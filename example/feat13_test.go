package main

import (
	"testing"
	"time"

	"github.com/idemgate/idemgate/pgstore"
)

// A task scheduled for later is polled at its time, not every second; a
// task to run now keeps the usual hint.
func TestPollHintHonoursRunAfter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		given    pgstore.Task
		min, max time.Duration
	}{
		{"scheduled in an hour", pgstore.Task{State: pgstore.StatePending, RunAfter: time.Now().Add(time.Hour)},
			59 * time.Minute, time.Hour},
		{"runs now", pgstore.Task{State: pgstore.StatePending, RunAfter: time.Now().Add(-time.Minute)},
			time.Second, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := viewOf(tt.given)
			if err != nil {
				t.Fatal(err)
			}
			if got := time.Duration(v.PollAfterMS) * time.Millisecond; got < tt.min || got > tt.max {
				t.Fatalf("poll_after_ms = %d, want between %v and %v", v.PollAfterMS, tt.min, tt.max)
			}
		})
	}
}
