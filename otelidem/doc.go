// Package otelidem reports what idemgate does as OpenTelemetry metrics and
// spans: the middleware's events, the time its store calls add to a
// request, and pgstore's tasks and workers.
//
// It uses only the OpenTelemetry API. The application chooses the SDK and
// exporters (Prometheus, OTLP, stdout) and passes its providers in Config;
// without them the global providers are used, which do nothing until the
// application installs an SDK.
//
// Wiring, for a service that uses both halves:
//
//	rec, err := otelidem.New(otelidem.Config{MeterProvider: mp, TracerProvider: tp})
//	e.Use(rec.Server())                               // a span per request
//	store := rec.Store(middleware.NewRedisStore(rdb)) // spans and durations of store calls
//	idem := middleware.New(middleware.Config{Store: store, OnEvent: rec.OnEvent, ...})
//	unregister, err := rec.ObserveTasks(tasks)        // task counts and ages, per collection
//	w, err := pgstore.NewWorker(tasks, pgstore.WorkerConfig{
//		Handler:   rec.Attempt(handle),               // a span per attempt, in the request's trace
//		Reconcile: rec.Reconcile(reconcile),
//		OnEvent:   rec.OnWorkerEvent,
//	})
//	// in the handler: task, err := rec.Submit(ctx, newTask, tasks.Submit)
//
// Attributes are bounded: route, method, kind, outcome, operation and
// state; the tenant only with Config.Tenant. A raw idempotency key, a user
// id or a body never becomes an attribute.
//
// Instruments (OpenTelemetry name; Prometheus name through the Prometheus
// exporter):
//
//	idemgate.requests                  idemgate_requests_total                   {request} by idemgate.outcome, http.request.method, http.route, idemgate.kind
//	idemgate.decision.duration         idemgate_decision_duration_seconds        s: from the middleware's start to its decision (claim, replay, conflict)
//	idemgate.store.duration            idemgate_store_duration_seconds           s: each store call, by idemgate.operation and idemgate.result
//	idemgate.wait.duration             idemgate_wait_duration_seconds            s: waits for an in-flight duplicate, by idemgate.wait.result
//	idemgate.tasks                     idemgate_tasks                            {task} by idemgate.task.kind and idemgate.task.state
//	idemgate.task.oldest.age           idemgate_task_oldest_age_seconds          s: oldest runnable / uncertain task, by idemgate.task.queue
//	idemgate.task.claim.duration       idemgate_task_claim_duration_seconds      s: the claim statement, per task it claimed
//	idemgate.task.attempts             idemgate_task_attempts_total              {attempt} by idemgate.task.outcome
//	idemgate.task.attempt.duration     idemgate_task_attempt_duration_seconds    s: an attempt, by idemgate.task.outcome
//	idemgate.task.rescues              idemgate_task_rescues_total               {task}: expired leases requeued
//	idemgate.task.stale_completions    idemgate_task_stale_completions_total     {completion}: fenced-off writes of a superseded attempt
//	idemgate.task.outcome_write.retries idemgate_task_outcome_write_retries_total {retry}: outcome writes retried after a transient error
package otelidem
