package idemgate

import "time"

// EventType says what happened to a request.
type EventType int

const (
	// EventClaimed: the request claimed its key and its handler runs.
	EventClaimed EventType = iota + 1
	// EventReplayed: a stored response was replayed; the handler did not run.
	EventReplayed
	// EventReused: the key is held by other parameters (fingerprint, owner
	// or kind differ, or the handler returned ErrKeyReused).
	EventReused
	// EventInProgress: the key is held by a request still running; the
	// request was answered 409 request_in_progress.
	EventInProgress
	// EventWaited: the request waited (Config.WaitInFlight) for another one
	// holding its key; Latency is the time spent waiting.
	EventWaited
	// EventReleased: the claim was released so a retry can run; Reason says why.
	EventReleased
	// EventLeaseLost: the request's claim was gone when it tried to extend,
	// complete or release it (lease expired, key flushed or re-claimed).
	EventLeaseLost
	// EventStoreError: a store call failed; Err holds the error.
	EventStoreError
	// EventFailOpen: the store was unreachable and the handler ran
	// unprotected because Config.FailOpen is set.
	EventFailOpen
)

var eventNames = [...]string{"invalid", "claimed", "replayed", "reused", "in_progress",
	"waited", "released", "lease_lost", "store_error", "fail_open"}

// String returns the event's name as used in logs and metrics, e.g. "replayed".
func (t EventType) String() string {
	if t < 0 || int(t) >= len(eventNames) {
		return "invalid"
	}
	return eventNames[t]
}

// Event describes one step of one request, for metrics and logs. It never
// carries a raw idempotency key, user or body.
type Event struct {
	Type EventType
	// Route is the method and route template, e.g. "POST /v1/images";
	// empty for Runner.Do, whose events Kind names.
	Route string
	// Kind is the business action kind of the route.
	Kind string
	// Tenant is the normalized tenant (keyspace.Key.Tenant), if known.
	Tenant string
	// Status is the response status, when the event has one.
	Status int
	// Reason is a short machine-readable cause, e.g. "not_cacheable",
	// "handler_error", "panic", "response_too_large", "claim", "complete";
	// "claim_failed" for the release after a failed claim call; on Atomic
	// routes "tx_aborted", "commit_refused" (the database refused the
	// COMMIT) and "commit_conflict" (a serialization failure or deadlock at
	// COMMIT); "decoded"
	// and "encoding_not_acceptable" for a replay whose stored encoding the
	// retry did not accept.
	Reason string
	// Err is the store error, for EventStoreError and EventFailOpen.
	Err error
	// Latency is the time from the start of the middleware to the event.
	Latency time.Duration
}
