package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/pgstore"
)

// Cancel a task its owner no longer wants, and watch the queue with Stats.
func ExampleStore_Cancel() {
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
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	task, err := store.Submit(ctx, pgstore.NewTask{
		Tenant: "acme", Owner: "owner-digest", Kind: "image", Runtime: "gpu", Network: "main",
		IdempotencyKey: "image:5d41402abc4b2a76", Fingerprint: "v1:9f86d081884c7d65",
	})
	if err != nil {
		log.Fatal(err)
	}
	st, err := store.Stats(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending images:", st.Counts["image"][pgstore.StatePending])

	cancelled, err := store.Cancel(ctx, task.Tenant, task.Owner, task.ID)
	if err != nil {
		log.Fatal(err)
	}
	p := pgstore.Project(cancelled)
	fmt.Println(p.State, "final:", p.PollAfter == 0)

	again, err := store.Cancel(ctx, task.Tenant, task.Owner, task.ID) // idempotent
	fmt.Println(again.State, err)

	_, err = store.Cancel(ctx, task.Tenant, "someone-else", task.ID)
	fmt.Println("another owner:", errors.Is(err, pgstore.ErrNotFound))
	// Output:
	// pending images: 1
	// cancelled final: true
	// cancelled <nil>
	// another owner: true
}
