package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Handler runs one attempt of a task and says how it ended. ctx is
// cancelled when the attempt must stop: its kind's Timeout passed, the
// worker can no longer confirm the task's lease (it was taken, or the
// database did not answer in time), the task was cancelled
// (Store.Cancel), or a shutdown's deadline passed. The handler should
// return promptly then. A panic counts as a lost attempt (see
// KindPolicy.Lost): by default Retry(0, err).
type Handler func(ctx context.Context, t Task) Outcome

// Outcome is how a handler's attempt ended. Make one with Succeeded,
// Failed, Retry or Uncertain; the zero Outcome counts as a failure.
type Outcome struct {
	kind    outcomeKind
	results []json.RawMessage
	err     error
	after   time.Duration
}

type outcomeKind int

const (
	outcomeNone outcomeKind = iota
	outcomeSucceeded
	outcomeFailed
	outcomeRetry
	outcomeUncertain
)

// Succeeded ends the task with results. A success needs at least one
// result item that is not JSON null; without one the task fails with
// "no result items".
func Succeeded(results ...json.RawMessage) Outcome {
	return Outcome{kind: outcomeSucceeded, results: results}
}

// Failed ends the task with err. Partial results are kept, hidden from
// clients, and make the task eligible for Store.Recover when at least
// one of them is not JSON null.
func Failed(err error, partial ...json.RawMessage) Outcome {
	return Outcome{kind: outcomeFailed, err: err, results: partial}
}

// Retry ends this attempt with err and runs the task again after after,
// or after the worker's exponential backoff when after <= 0. Past
// WorkerConfig.MaxAttempts the task fails instead.
func Retry(after time.Duration, err error) Outcome {
	return Outcome{kind: outcomeRetry, err: err, after: after}
}

// Uncertain parks the task when the upstream outcome is unknown (a
// timeout after the request was sent): running it again could do the work
// twice. It is never run again by itself; WorkerConfig.Reconcile decides.
func Uncertain(err error) Outcome {
	return Outcome{kind: outcomeUncertain, err: err}
}

// final reports whether o ends the task for good (Succeeded or Failed).
func (o Outcome) final() bool {
	return o.kind == outcomeSucceeded || o.kind == outcomeFailed
}

// safeErr returns err, or, when err's Error method panics (a typed nil
// pointer does), an error saying so: a handler's error is user code, and
// its text is read by decide, the logger and OnEvent outside the
// handler's recover.
func safeErr(err error) (out error) {
	if err == nil {
		return nil
	}
	defer func() {
		if p := recover(); p != nil {
			out = fmt.Errorf("pgstore: the handler's error (%T) panicked in Error: %v", err, p)
		}
	}()
	_ = err.Error()
	return err
}
