// Package otelpgstore reports what pgstore does as OpenTelemetry metrics
// and spans: submits, attempts and their outcomes, worker events, and the
// task store's counts and ages.
//
// It uses only the OpenTelemetry API; the application chooses the SDK and
// exporters and passes its providers in Config. The middleware's side is
// package otelidem, which does not import pgstore (or pgx); a service that
// uses both makes one Recorder of each on the same providers. Both report
// under the instrumentation scope github.com/idemgate/idemgate/otelidem.
//
// Wiring:
//
//	tr, err := otelpgstore.New(otelpgstore.Config{MeterProvider: mp, TracerProvider: tp})
//	unregister, err := tr.ObserveTasks(tasks)         // task counts and ages, per collection
//	w, err := pgstore.NewWorker(tasks, pgstore.WorkerConfig{
//		Handler:   tr.Attempt(handle),                // a span per attempt, in the request's trace
//		Reconcile: tr.Reconcile(reconcile),
//		OnEvent:   tr.OnWorkerEvent,
//	})
//	// in the request's handler:
//	task, err := tr.Submit(ctx, newTask, tasks.Submit)
//
// Submit stores the request's trace context in Task.Trace (a W3C
// traceparent), and Attempt continues it: one trace shows the request,
// the submit and, later and in whichever worker process runs it, each
// attempt of the task.
//
// Attributes are bounded: kind, state, queue and outcome on metrics; the
// task id and attempt number on spans only. A task's parameters, result
// or idempotency key never become an attribute, and Submit's error is
// recorded on its span with the key replaced by "[key]".
//
// Instruments (OpenTelemetry name; Prometheus name through the Prometheus
// exporter):
//
//	idemgate.tasks                             idemgate_tasks                             {task} by idemgate.task.kind and idemgate.task.state
//	idemgate.task.oldest.age                   idemgate_task_oldest_age_seconds           s: oldest runnable / uncertain task, by idemgate.task.queue
//	idemgate.task.claim.duration               idemgate_task_claim_duration_seconds       s: the claim statement, per task it claimed
//	idemgate.task.attempts                     idemgate_task_attempts_total               {attempt} by idemgate.task.outcome
//	idemgate.task.attempt.duration             idemgate_task_attempt_duration_seconds     s: an attempt, by idemgate.task.outcome
//	idemgate.task.rescues                      idemgate_task_rescues_total                {task}: expired leases requeued
//	idemgate.task.stale_completions            idemgate_task_stale_completions_total      {completion}: fenced-off writes of a superseded attempt
//	idemgate.task.outcome_write.retries        idemgate_task_outcome_write_retries_total  {retry}: outcome writes retried after a transient error
//	idemgate.task.limit.max_running            idemgate_task_limit_max_running            {attempt}: the kind's MaxRunning, while set
//	idemgate.task.limit.max_running_per_tenant idemgate_task_limit_max_running_per_tenant {attempt}: the kind's MaxRunningPerTenant, while set
//	idemgate.task.limit.starts                 idemgate_task_limit_starts_per_second      {start}/s: the kind's StartsPerSecond, while set
//	idemgate.task.limit.usage                  idemgate_task_limit_usage                  {attempt}: attempts of the kind that count against its limits now
//	idemgate.task.paused                       idemgate_task_paused                       1 while the kind is paused, else 0
//	idemgate.task.held_back                    idemgate_task_held_back_total              {claim}: claims that left a due task of the kind waiting for its limits
//
// The limits and paused (pgstore.KindLimits) are read by ObserveTasks with
// the task counts; a kind reports paused always, and each limit only while
// it is set, so that idemgate_task_limit_usage /
// idemgate_task_limit_max_running is a kind's use of its limit and is
// absent for a kind without one. Usage is pgstore.Stats.Attempts, what a
// claim counts, not idemgate_tasks{idemgate_task_state="running"}: a
// task cancelled while its handler winds down is no longer running but
// still holds its slot, and a dead worker's task holds it until its
// lease ends. idemgate.task.held_back counts the
// WorkerHeldBack events: one per kind per claim that found the kind (or a
// tenant of it) out of room, so a rising count says the limits, not the
// workers, are what holds the queue.
//
// Spans: idemgate.task.submit (Submit), idemgate.task.attempt (Attempt)
// and idemgate.task.reconcile (Reconcile).
package otelpgstore
