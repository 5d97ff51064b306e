package pgstore

import (
	"bytes"
	"encoding/json"
	"time"
)

// Projection is what a client is told about a task.
type Projection struct {
	TaskID string
	State  State
	// PollAfter > 0 exactly when the task is unfinished: poll the same
	// task ID again after it, and never resubmit under a new ID.
	PollAfter time.Duration
	// RunAfter is set while the task waits to run (pending or retrying):
	// no worker takes it before then. PollAfterAt says when to poll.
	RunAfter time.Time
	// Results is non-nil only for a success, and then has at least one
	// item. Partial results of an unfinished or failed task never show.
	Results []json.RawMessage
	// Error is set (never empty) for every failure and for a cancelled
	// task.
	Error string
}

// How long a client waits before polling again, by state.
const (
	pollPending   = time.Second
	pollRunning   = time.Second
	pollRetrying  = 2 * time.Second
	pollUncertain = 5 * time.Second
)

// Project tells what a client sees of t:
//
//   - pending, running, retrying, uncertain: keep polling the same task ID
//     (PollAfter > 0, no results, even if partial ones exist); a pending
//     or retrying task also tells when it may run (RunAfter);
//   - succeeded with at least one result item that is not JSON null: the
//     results (null items left out);
//   - succeeded with none: failed, "no result items";
//   - failed: failed with its error ("task failed" if none was recorded);
//   - cancelled: cancelled, final, with the error "cancelled" (no results,
//     even if some were made).
//
// A state Project does not know (a newer schema's) is shown as unfinished,
// so a client keeps polling rather than resubmitting.
func Project(t Task) Projection {
	p := Projection{TaskID: t.ID, State: t.State}
	switch t.State {
	case StatePending:
		p.PollAfter, p.RunAfter = pollPending, t.RunAfter
	case StateRunning:
		p.PollAfter = pollRunning
	case StateRetrying:
		p.PollAfter, p.RunAfter = pollRetrying, t.RunAfter
	case StateUncertain:
		p.PollAfter = pollUncertain
	case StateSucceeded:
		if p.Results = realItems(t.Results); p.Results == nil {
			p.State, p.Error = StateFailed, "no result items"
		}
	case StateFailed:
		p.Error = t.Error
		if p.Error == "" {
			p.Error = "task failed"
		}
	case StateCancelled:
		p.Error = "cancelled"
	default:
		p.PollAfter = pollUncertain
	}
	return p
}

// PollAfterAt is how long after now a client should poll again: PollAfter,
// or longer if the task is not to run before then (RunAfter). Zero when
// the task is finished.
func (p Projection) PollAfterAt(now time.Time) time.Duration {
	if p.PollAfter <= 0 {
		return 0
	}
	return max(p.PollAfter, p.RunAfter.Sub(now))
}

// realItems returns the items that are not empty or JSON null, or nil.
func realItems(items []json.RawMessage) []json.RawMessage {
	var out []json.RawMessage
	for _, it := range items {
		if v := bytes.TrimSpace(it); len(v) == 0 || bytes.Equal(v, []byte("null")) {
			continue
		}
		out = append(out, it)
	}
	return out
}
