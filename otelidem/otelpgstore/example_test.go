package otelpgstore_test

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"

	"github.com/idemgate/idemgate/otelidem/otelpgstore"
	"github.com/idemgate/idemgate/pgstore"
)

// A service's wiring. The providers are the application's: here the global
// ones, which record nothing until the application installs an SDK. The
// Example that reads the instruments back through the SDK is in
// otelidem/internal/sdktest, a module of its own, so that this module
// requires the OpenTelemetry API only.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost:5432/app")
	if err != nil {
		panic(err)
	}
	tasks, err := pgstore.New(ctx, pool)
	if err != nil {
		panic(err)
	}
	tr, err := otelpgstore.New(otelpgstore.Config{MeterProvider: otel.GetMeterProvider(), TracerProvider: otel.GetTracerProvider()})
	if err != nil {
		panic(err)
	}
	if _, err := tr.ObserveTasks(tasks); err != nil { // task counts and ages, per collection
		panic(err)
	}
	w, err := pgstore.NewWorker(tasks, pgstore.WorkerConfig{
		Handler: tr.Attempt(func(ctx context.Context, t pgstore.Task) pgstore.Outcome { // a span per attempt, in the request's trace
			return pgstore.Succeeded(json.RawMessage(`{"done":true}`))
		}),
		OnEvent: tr.OnWorkerEvent, // idemgate.task.attempts by outcome
	})
	if err != nil {
		panic(err)
	}
	go func() { _ = w.Run(ctx) }()

	// In a request's handler: the task's attempts join the request's trace.
	_, err = tr.Submit(ctx, pgstore.NewTask{Tenant: "acme", Owner: "alice", Kind: "image", IdempotencyKey: "k"}, tasks.Submit)
	if err != nil {
		panic(err)
	}
}
