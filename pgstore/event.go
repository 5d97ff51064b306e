package pgstore

import "time"

// WorkerEvent is something a Worker did, for metrics and logs. It never
// carries a task's parameters or results.
type WorkerEvent struct {
	Type    WorkerEventType
	Kind    string // the task's kind
	TaskID  string
	Attempt int
	// Latency is, for WorkerClaimed, how long the claim statement took;
	// for an attempt's end (succeeded, failed, retried, uncertain,
	// cancelled, timed_out, reconciled, stale), how long the attempt ran.
	Latency time.Duration
	Err     error // the attempt's error, or the database error of a write
}

// WorkerEventType says what a WorkerEvent reports.
type WorkerEventType string

// The events of a Worker.
const (
	WorkerClaimed      WorkerEventType = "claimed"       // an attempt began
	WorkerSucceeded    WorkerEventType = "succeeded"     // the task succeeded
	WorkerFailed       WorkerEventType = "failed"        // the task failed (for good)
	WorkerRetried      WorkerEventType = "retried"       // the attempt ended; the task runs again later
	WorkerUncertain    WorkerEventType = "uncertain"     // the task was parked as uncertain
	WorkerRescued      WorkerEventType = "rescued"       // a lost attempt (lease expired) was taken back
	WorkerStale        WorkerEventType = "stale"         // a fenced write was rejected: the attempt had lost its task
	WorkerOutcomeRetry WorkerEventType = "outcome_retry" // writing an outcome failed and is tried again
	WorkerCancelled    WorkerEventType = "cancelled"     // a running attempt was cancelled by Store.Cancel
	WorkerTimedOut     WorkerEventType = "timed_out"     // an attempt ran past its kind's Timeout
	WorkerReconciled   WorkerEventType = "reconciled"    // Reconcile resolved an uncertain task
	// WorkerHeldBack: a claim left a due task of Kind waiting because of
	// the kind's limits (KindLimits: paused, MaxRunning,
	// MaxRunningPerTenant or StartsPerSecond). Only Kind is set; one
	// event per kind and claim. The tasks of a tenant already at its
	// MaxRunningPerTenant are passed by without one.
	WorkerHeldBack WorkerEventType = "held_back"
)

// stateHeld marks the row a claim returns for a kind it held back.
const stateHeld State = "held"
