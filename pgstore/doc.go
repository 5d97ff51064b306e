// Package pgstore is idemgate's Postgres task store: the truth behind the
// Redis accelerator. Whatever Redis forgets, a task is never created twice
// and an accepted task is never lost, because uniqueness lives in the
// database: a unique index on (tenant, idempotency_key, runtime, network)
// is the final arbiter of every Submit.
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
//	Submit ──▶ pending ──claim──▶ running ──Succeeded──────────▶ succeeded
//	                               │  ▲  ╰──Failed, or the last──▶ failed
//	        Retry, lease expired,  │  │     attempt ran out          │
//	        released at shutdown   ▼  │ claim (after backoff)        │ Recover
//	                             retrying ◀────────────────────────╯ (partial results,
//	                               ▲                                   ≤ MaxRecoveries)
//	running ──Uncertain──▶ uncertain ──Reconcile──▶ succeeded, failed or retrying
//
// Pending, running, retrying and uncertain are unfinished: a client polls
// the same task ID (see Project). Uncertain is never run again by itself:
// only WorkerConfig.Reconcile moves it on.
//
// # Workers
//
// A Worker claims runnable tasks in batches (a FOR UPDATE SKIP LOCKED CTE
// feeding one UPDATE … RETURNING), runs its Handler on each, and records
// the Outcome. Each claim increments Task.Attempt and gives the attempt a
// lease, which the worker extends while the handler runs. Every transition
// is fenced by WHERE id = $1 AND attempt = $2, so a worker that lost its
// lease (it hung, or was partitioned away) cannot overwrite a newer
// attempt. Expired leases are requeued as retrying with exponential
// backoff and jitter by any worker's rescuer, up to MaxAttempts.
//
// Workers wake on LISTEN/NOTIFY and poll as a fallback, so they also work
// behind a transaction pooler. There is no trigger: the statement that
// inserts a new task (Submit, SubmitTx) calls pg_notify itself, and the
// notification is delivered when its transaction commits. Submit announces
// a burst once per 25ms per kind; a woken worker looks again shortly after
// for the rest. Recover and a release at shutdown notify too. Run any
// number of workers, in any number of processes, against one database.
//
// Time: leases and schedules are computed by the database's now() inside
// the SQL, so every node fences against one clock; Go passes durations
// only.
//
// # Migrations
//
// Store.Migrate applies versioned migrations compiled into the package,
// serialized across nodes by an advisory lock that is polled, never waited
// on. Version 1 creates the table with the narrow unique index
// (tenant, idempotency_key); version 2 builds the wide index
// CONCURRENTLY, reads it back from pg_index (indisvalid AND indisready),
// and only then drops the narrow one. Killed at any point, the table keeps
// a valid unique index on the key, and a rerun finishes the job.
package pgstore
