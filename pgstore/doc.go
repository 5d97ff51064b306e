// Package pgstore is idemgate's Postgres task store: the truth behind the
// Redis accelerator. Whatever Redis forgets, a task is never created twice
// and an accepted task is never lost, because uniqueness lives in the
// database: a unique index on the SHA-256 digest of (tenant,
// idempotency_key, runtime, network), the column key_digest (schema v12;
// before, an index on the four columns), is the final arbiter of every
// Submit.
//
// # Tasks
//
// Store.Submit inserts a task or returns the one already holding its key
// (Task.Duplicate), in one statement; a key held with another owner, kind
// or fingerprint is ErrConflict. Store.Get reads a task for its owner
// only. Project turns a task into what a client may see.
//
// A task moves through these states:
//
//	Submit ──▶ pending ──claim──▶ running ──Succeeded──────────────────▶ succeeded
//	                               │  ▲  ╰──Failed, or out of attempts──▶ failed
//	  Retry; a lost attempt of a   │  │ claim, after the backoff           │
//	  LostRetry kind               ▼  │                                    │ Recover
//	                             retrying ◀────────────────────────────────╯
//	running ──Uncertain; a lost attempt of a LostUncertain kind──▶ uncertain
//	uncertain ──Reconcile──▶ succeeded, failed or retrying (or stays uncertain)
//	pending, running, retrying, uncertain ──Store.Cancel──▶ cancelled
//
// Pending, running, retrying and uncertain are unfinished: a client polls
// the same task ID (see Project). Succeeded, failed and cancelled are
// final. Uncertain is never run again by itself: only
// WorkerConfig.Reconcile moves it on, and a Reconcile that panics, times
// out or returns nothing leaves it uncertain. Store.Stats counts the
// unfinished tasks and gives the age of the oldest waiting and the oldest
// uncertain one.
//
// # Workers
//
// A Worker claims runnable tasks in batches (a FOR UPDATE SKIP LOCKED CTE
// feeding one UPDATE … RETURNING; with Kinds, one CTE per kind on the
// (kind, priority, turn, run_after) index, so other kinds' backlog is
// never read), runs its Handler on each, and records the Outcome. Each claim increments
// Task.Attempt and gives the attempt a lease, which the worker extends
// while the handler runs. Every transition is fenced by WHERE id = … AND
// attempt = … AND state = …, so a worker that lost its lease (it hung,
// or was partitioned away) cannot overwrite a newer attempt.
//
// The worker also cancels the handler itself when it can no longer
// confirm the lease: at the claim's or the last answered heartbeat's
// send time plus Lease less a tenth, by its own monotonic clock. A
// rescuer takes a task over only a tenth of a Lease after the lease
// ended by the database's clock, so a cut-off attempt is cancelled
// before anyone else may start one. What a lost attempt (lease expired,
// released at shutdown, timed out, panicked) becomes is its kind's
// KindPolicy.Lost: LostRetry (the default: requeued with exponential
// backoff and jitter, up to MaxAttempts) or LostUncertain (parked for
// Reconcile: for work that may already have reached an upstream that must
// not be called twice). KindPolicy.Timeout (default DefaultTimeout, 10
// minutes) bounds each attempt.
//
// # Fair claiming and kind limits
//
// Claims take the highest priority first (strictly), and within a kind
// and a priority the tenants in turn: Submit gives each task a turn, the
// one after its tenant's last waiting task but never before the next turn
// to be served, and claims take the lowest turns first. So a tenant's
// backlog delays another tenant's task by about one task per tenant with
// waiting work, not by the backlog's length. A retried task keeps its
// turn (it goes first when due); Operator.Retry gives a new one.
//
// Store.SetKindLimits stores KindLimits in the database: MaxRunning and
// MaxRunningPerTenant (attempts holding a lease, across all workers),
// StartsPerSecond (a token bucket) and Paused. Every claim applies them,
// first attempts, retries and Reconcile calls alike; claims of a limited
// kind are serialized by an advisory lock taken in the claim's own
// transaction, so workers racing for the last slot never exceed a
// limit, and a dead worker's attempt counts until its lease ends. A
// claim that left a due task waiting because of a limit emits
// WorkerHeldBack. Store.Stats reports the limits beside the counts.
//
// Operator (Store.Operator) is for operator tools: List with a Filter,
// and Get, Cancel and Retry by task ID alone, for any tenant.
//
// A handler's slot is free once it returns; its outcome may wait up to
// WorkerConfig.CompletionWait while other handlers run, so that the final
// transitions of many attempts are written in one statement (each still
// fenced by its attempt, its lease still kept).
//
// Workers wake on LISTEN/NOTIFY and poll as a fallback, so they also work
// behind a transaction pooler. There is no trigger: the statement that
// inserts a new task (Submit, SubmitTx) calls pg_notify itself, and the
// notification is delivered when its transaction commits. Submit announces
// a burst once per 25ms per kind (by monotonic time); a worker looks again
// 100ms after the last notification it got, for the rest of the burst.
// Recover, Cancel and a release at shutdown notify too; a cancellation
// reaches the running attempt at once. Run any number of workers, in any
// number of processes, against one database.
//
// Time: leases and schedules are computed by the database's now() inside
// the SQL, so every node fences against one clock; Go passes durations
// only. The only local clock is the worker's own deadline for its leases,
// measured by the monotonic clock.
//
// Prune deletes finished tasks; give it at least the retention of the
// layer that answers retries (the middleware's Retention), or a retry
// after the prune would make a new task.
//
// # Migrations
//
// Store.Migrate applies versioned migrations compiled into the package,
// serialized across nodes by an advisory lock that is polled, never waited
// on. Version 1 creates the table with the narrow unique index
// (tenant, idempotency_key); version 2 builds the wide index
// CONCURRENTLY, reads it back from pg_index (indisvalid AND indisready),
// and only then drops the narrow one. Killed at any point, the table keeps
// a valid unique index on the key, and a rerun finishes the job. Version 3
// adds the trace and lost-policy columns, the cancelled state and the
// cancel notification; version 4 validates v3's checks and builds the
// claim index by kind and the finished-task index, CONCURRENTLY; version 5
// adds priority, version 6 turns and the kind limits table, each with
// their claim indexes built CONCURRENTLY and read back before the ones
// they replace are dropped; version 7 bounds the kind limits' rate;
// version 8 rebuilds the claim indexes the same way, so that a task
// scheduled for later waits outside them until it is due; version 9 adds
// idemgate_waiting_tenants, the lines with waiting tasks, kept by
// statement triggers, which a claim walks past capped tenants; version 10
// drops the index of every kind's waiting tasks (a worker of any kind
// reads each kind's line on the claim index), so that an insert writes
// four indexes, not five; version 11 pins the search_path of the
// schema's functions (pg_catalog, the schema, pg_temp), spells their
// operators, grants EXECUTE to the roles that may write the tasks instead
// of PUBLIC, and lets the trigger list lines under any isolation level.
// Every migration runs under READ COMMITTED whatever
// default_transaction_isolation says. The
// migrating session's search_path is pinned to the schema it migrates,
// and what a step drops is read back from that schema's catalog and named
// by it, so a migration never touches another schema.
package pgstore
