package main

import (
	"errors"
	"net/http"
	"strconv"
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

func TestImageRequestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		given   imageRequest
		want    imageParams
		wantErr bool
	}{
		{name: "defaults", given: imageRequest{Prompt: "a cat"}, want: imageParams{Prompt: "a cat", AspectRatio: "1:1", N: 1}},
		{name: "all fields", given: imageRequest{Prompt: "a cat", AspectRatio: ptr("9:16"), N: ptr(4),
			ReferenceImage: "https://example.com/ref.png", ClientNote: "hi"},
			want: imageParams{Prompt: "a cat", AspectRatio: "9:16", N: 4, ReferenceImage: "https://example.com/ref.png"}},
		{name: "blank prompt", given: imageRequest{Prompt: "  "}, wantErr: true},
		{name: "explicit n 0", given: imageRequest{Prompt: "a cat", N: ptr(0)}, wantErr: true},
		{name: "n 5", given: imageRequest{Prompt: "a cat", N: ptr(5)}, wantErr: true},
		{name: "unknown aspect", given: imageRequest{Prompt: "a cat", AspectRatio: ptr("2:1")}, wantErr: true},
		{name: "reference not a URL", given: imageRequest{Prompt: "a cat", ReferenceImage: "/etc/passwd"}, wantErr: true},
		{name: "reference data URL", given: imageRequest{Prompt: "a cat", ReferenceImage: "data:image/png;base64,AA=="},
			want: imageParams{Prompt: "a cat", AspectRatio: "1:1", N: 1, ReferenceImage: "data:image/png;base64,AA=="}},
		{name: "invalid UTF-8", given: imageRequest{Prompt: "a \xff cat"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := tt.given.validate()
			if tt.wantErr {
				var p *problem
				if !errors.As(err, &p) || p.Status != http.StatusBadRequest {
					t.Fatalf("validate() error = %v, want a 400 problem", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("validate() = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

// Retry-After and poll_after_ms tell a client the same wait, however far
// away the task's start is: a task scheduled centuries ahead (RunAfter is
// accepted up to year 9999) must not overflow into "poll every second".
func TestRetryAfterAgreesWithPollHint(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		given time.Time
	}{
		{"in an hour", time.Now().Add(time.Hour)},
		{"after year 2318", time.Date(2400, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"year 9999", time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := viewOf(pgstore.Task{State: pgstore.StatePending, RunAfter: tt.given})
			if err != nil {
				t.Fatal(err)
			}
			got, err := strconv.ParseInt(retryAfter(v.PollAfterMS), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			if want := (v.PollAfterMS + 999) / 1000; got != want {
				t.Fatalf("Retry-After = %d s, poll_after_ms = %d: want %d s", got, v.PollAfterMS, want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }
