package pgstore

import (
	"encoding/json"
	"fmt"
	"time"
)

// ending is why an attempt ended.
type ending int

const (
	endReturned  ending = iota // the handler returned while its attempt stood
	endPanicked                // the handler panicked
	endTimedOut                // the kind's Timeout passed
	endLeaseLost               // the lease was lost or could not be confirmed, or the task was released at shutdown
	endCancelled               // Store.Cancel ended the task
	endReleased                // released at shutdown
)

// verdict is what decide needs to know about an ended attempt.
type verdict struct {
	from     State      // running, or uncertain for a Reconcile
	end      ending     //
	returned bool       // the handler returned outcome
	outcome  Outcome    //
	cause    error      // why the attempt's context ended, or the panic
	lost     LostPolicy // the kind's policy for a lost attempt
}

// write is the statement a transition needs.
type write int

const (
	writeNone      write = iota // nothing to write
	writeFinish                 // succeeded or failed, for good
	writeRetry                  // run again after a delay
	writeUncertain              // park until a reconcile check
	writeCancelled              // end a task cancelled while the attempt ran
	writeRelease                // hand the task back at shutdown, by the kind's Lost policy
)

// transition is what an ended attempt does to its task.
type transition struct {
	write   write
	to      State  // for writeFinish: succeeded or failed
	results []byte // for writeFinish: a JSON array Postgres can store
	err     string // the error to store, storable
	after   time.Duration
	event   WorkerEventType // what to report once the write applied
}

// decide turns an ended attempt into its task's transition. It is pure:
// every rule of what an outcome does in which state lives here.
//
//   - Cancelled: the task ends cancelled, whatever the handler returned.
//     Cancel only recorded the cancellation: the attempt held its task
//     (and its kind's limits) until its handler stopped.
//   - Released at shutdown: the task goes back by its kind's Lost
//     policy, written once the handler stopped, whatever it returned (it
//     was cut short). A Reconcile's task stays uncertain (its claim
//     lapses), unless it answered Succeeded or Failed.
//   - A returned Succeeded or Failed counts however the attempt ended:
//     the work is done (a success needs a real result item).
//   - From running, a returned Retry or Uncertain is applied as asked; an
//     attempt that ended without one (panic, timeout, lost lease) ends as
//     its kind's Lost policy says: retry with backoff, or uncertain.
//   - From uncertain (Reconcile), only an explicit Succeeded, Failed or
//     Retry moves the task on; anything else (panic, zero outcome,
//     timeout) leaves it uncertain, to be asked again. An uncertain task
//     is never run again by accident.
func decide(v verdict) transition {
	switch v.end {
	case endCancelled:
		return transition{write: writeCancelled, event: WorkerCancelled}
	case endReleased:
		// An uncertain task is not released: its claim lapses, and a
		// Reconcile that answered for good as shutdown cancelled it is
		// recorded below (its claim fences it).
		if v.from != StateUncertain {
			return transition{write: writeRelease, event: WorkerRetried}
		}
		if !v.returned || !v.outcome.final() {
			return transition{write: writeNone}
		}
	}
	o := v.outcome
	if v.returned && o.final() {
		tr := finish(o)
		if v.from == StateUncertain {
			tr.event = WorkerReconciled
		}
		return tr
	}
	if v.from == StateUncertain {
		switch {
		case v.end == endReturned && o.kind == outcomeRetry:
			return transition{write: writeRetry, err: errText(o.err, "retry"), after: retryAfter(o.after), event: WorkerReconciled}
		case v.end == endReturned && o.kind == outcomeUncertain:
			return transition{write: writeUncertain, err: errText(o.err, "upstream outcome unknown"), event: WorkerUncertain}
		}
		tr := transition{write: writeUncertain, err: storableText("reconcile: " + why(v)), event: WorkerUncertain}
		if v.end == endTimedOut {
			tr.event = WorkerTimedOut
		}
		return tr
	}
	if v.end == endReturned {
		switch o.kind {
		case outcomeRetry:
			return transition{write: writeRetry, err: errText(o.err, "retry"), after: retryAfter(o.after), event: WorkerRetried}
		case outcomeUncertain:
			return transition{write: writeUncertain, err: errText(o.err, "upstream outcome unknown"), event: WorkerUncertain}
		default: // the zero Outcome
			return transition{write: writeFinish, to: StateFailed, results: []byte("[]"),
				err: "handler returned no outcome", event: WorkerFailed}
		}
	}
	// Lost: ended without an outcome that says what happened.
	tr := transition{err: storableText(why(v))}
	if v.lost == LostUncertain {
		tr.write, tr.event = writeUncertain, WorkerUncertain
		tr.err = storableText(why(v) + ": the upstream outcome is unknown")
	} else {
		tr.write, tr.after, tr.event = writeRetry, -1, WorkerRetried
	}
	if v.end == endTimedOut {
		tr.event = WorkerTimedOut
	}
	return tr
}

// finish is the transition of a Succeeded or Failed outcome.
func finish(o Outcome) transition {
	results := jsonArray(o.results)
	switch {
	case !json.Valid(results):
		return transition{write: writeFinish, to: StateFailed, results: []byte("[]"),
			err: "handler returned results that are not JSON", event: WorkerFailed}
	case o.kind == outcomeFailed:
		return transition{write: writeFinish, to: StateFailed, results: storableJSON(results),
			err: errText(o.err, "task failed"), event: WorkerFailed}
	case realItems(o.results) == nil:
		return transition{write: writeFinish, to: StateFailed, results: storableJSON(results),
			err: "no result items", event: WorkerFailed}
	}
	return transition{write: writeFinish, to: StateSucceeded, results: storableJSON(results), event: WorkerSucceeded}
}

// why says in words how an attempt that ended without an outcome ended.
func why(v verdict) string {
	switch v.end {
	case endPanicked:
		return fmt.Sprintf("handler panic: %v", v.cause)
	case endTimedOut:
		return "attempt timed out"
	case endReturned:
		return "returned no outcome"
	default:
		if v.cause != nil {
			return "attempt lost: " + v.cause.Error()
		}
		return "attempt lost"
	}
}

// errText is err's text made storable, or def when err says nothing.
func errText(err error, def string) string {
	if err != nil && err.Error() != "" {
		return storableText(err.Error())
	}
	return def
}

// retryAfter is a Retry's delay: < 0 asks for the backoff.
func retryAfter(d time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return -1
}

// jsonArray encodes items as a JSON array for a jsonb parameter; an
// empty item counts as null.
func jsonArray(items []json.RawMessage) []byte {
	if len(items) == 0 {
		return []byte("[]")
	}
	b := []byte{'['}
	for i, it := range items {
		if i > 0 {
			b = append(b, ',')
		}
		if len(it) == 0 {
			it = json.RawMessage("null")
		}
		b = append(b, it...)
	}
	return append(b, ']')
}
