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
//	idemgate.tasks                      idemgate_tasks                            {task} by idemgate.task.kind and idemgate.task.state
//	idemgate.task.oldest.age            idemgate_task_oldest_age_seconds          s: oldest runnable / uncertain task, by idemgate.task.queue
//	idemgate.task.claim.duration        idemgate_task_claim_duration_seconds      s: the claim statement, per task it claimed
//	idemgate.task.attempts              idemgate_task_attempts_total              {attempt} by idemgate.task.outcome
//	idemgate.task.attempt.duration      idemgate_task_attempt_duration_seconds    s: an attempt, by idemgate.task.outcome
//	idemgate.task.rescues               idemgate_task_rescues_total               {task}: expired leases requeued
//	idemgate.task.stale_completions     idemgate_task_stale_completions_total     {completion}: fenced-off writes of a superseded attempt
//	idemgate.task.outcome_write.retries idemgate_task_outcome_write_retries_total {retry}: outcome writes retried after a transient error
//
// Spans: idemgate.task.submit (Submit), idemgate.task.attempt (Attempt)
// and idemgate.task.reconcile (Reconcile).
package otelpgstore
