package pgstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/pgstore"
)

// Submit a task twice, see the retry replay and a drifted retry refused,
// and let a worker run it to a result a client can see.
func Example() {
	databaseURL, drop := testenv.ExampleDatabase() // yours: os.Getenv("DATABASE_URL")
	defer drop()

	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close() // before drop
	store, err := pgstore.New(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil { // every node may do this at boot
		log.Fatal(err)
	}

	task := pgstore.NewTask{
		Tenant: "acme", Owner: "owner-digest", Kind: "image", Runtime: "gpu", Network: "main",
		IdempotencyKey: "image:5d41402abc4b2a76", Fingerprint: "v1:9f86d081884c7d65",
		Params: json.RawMessage(`{"prompt":"a cat in a hat"}`),
	}
	first, err := store.Submit(ctx, task)
	if err != nil {
		log.Fatal(err)
	}
	retry, err := store.Submit(ctx, task) // a true retry: the same task
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("retry replays the task:", retry.ID == first.ID, retry.Duplicate)

	drifted := task
	drifted.Fingerprint = "v1:2c26b46b68ffc68f" // same key, other parameters
	_, err = store.Submit(ctx, drifted)
	fmt.Println("drifted retry refused:", errors.Is(err, pgstore.ErrConflict))

	worker, err := pgstore.NewWorker(store, pgstore.WorkerConfig{
		Handler: func(ctx context.Context, t pgstore.Task) pgstore.Outcome {
			return pgstore.Succeeded(json.RawMessage(`{"url":"https://cdn.example/cat.png"}`))
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	workCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- worker.Run(workCtx) }()

	// A client polls the same task ID until the projection says stop.
	for {
		t, err := store.Get(ctx, task.Tenant, task.Owner, first.ID)
		if err != nil {
			log.Fatal(err)
		}
		p := pgstore.Project(t)
		if p.PollAfter == 0 { // finished
			if p.State == pgstore.StateSucceeded {
				fmt.Printf("%s: %s\n", p.State, p.Results[0])
			} else {
				fmt.Printf("%s: %s\n", p.State, p.Error)
			}
			break
		}
		time.Sleep(10 * time.Millisecond) // a real client waits p.PollAfter
	}
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output:
	// retry replays the task: true true
	// drifted retry refused: true
	// succeeded: {"url": "https://cdn.example/cat.png"}
}
