package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/pgstore"
)

// Submit a batch in one round trip: each task is stored, read back, or
// refused on its own. One is scheduled for later, one goes first.
func ExampleStore_SubmitMany() {
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
	task := func(key, fingerprint string) pgstore.NewTask {
		return pgstore.NewTask{Tenant: "acme", Owner: "owner-digest", Kind: "image", Runtime: "gpu",
			Network: "main", IdempotencyKey: key, Fingerprint: fingerprint}
	}
	nightly := task("image:nightly", "v1:aa")
	nightly.RunAfter = time.Now().Add(8 * time.Hour) // not claimed before then
	urgent := task("image:urgent", "v1:bb")
	urgent.Priority = 10 // claimed before priority 0 of its kind

	results, err := store.SubmitMany(ctx, []pgstore.NewTask{
		nightly,
		urgent,
		task("image:urgent", "v1:bb"), // the same request again: the same task
		task("image:urgent", "v1:cc"), // the same key, other parameters
	})
	if err != nil {
		log.Fatal(err) // the batch failed as a whole; nothing was stored
	}
	for _, r := range results {
		switch {
		case errors.Is(r.Err, pgstore.ErrConflict):
			fmt.Println("conflict: key held by a task with other parameters")
		case r.Err != nil:
			fmt.Println("refused:", r.Err)
		default:
			p := pgstore.Project(r.Task)
			fmt.Printf("%s priority %d duplicate %v, poll in ~%.0fh\n", r.Task.IdempotencyKey, r.Task.Priority,
				r.Task.Duplicate, p.PollAfterAt(time.Now()).Hours())
		}
	}
	fmt.Println("one task for both urgent requests:", results[1].Task.ID == results[2].Task.ID)
	// Output:
	// image:nightly priority 0 duplicate false, poll in ~8h
	// image:urgent priority 10 duplicate false, poll in ~0h
	// image:urgent priority 10 duplicate true, poll in ~0h
	// conflict: key held by a task with other parameters
	// one task for both urgent requests: true
}
