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

// Bound a kind across every worker of the database, pause it during an
// upstream outage, and steer single tasks as an operator.
func ExampleStore_SetKindLimits() {
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

	// At most 8 image attempts at once, 2 per tenant, 5 starts a second.
	limits := pgstore.KindLimits{MaxRunning: 8, MaxRunningPerTenant: 2, StartsPerSecond: 5}
	if err := store.SetKindLimits(ctx, "image", limits); err != nil {
		log.Fatal(err)
	}
	// The upstream is down: pause the kind. Submit still accepts.
	limits.Paused = true
	if err := store.SetKindLimits(ctx, "image", limits); err != nil {
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
	fmt.Printf("image: %d pending, paused %v, max running %d\n",
		st.Counts["image"][pgstore.StatePending], st.Limits["image"].Paused, st.Limits["image"].MaxRunning)

	// An operator finds the task without its owner, and cancels it.
	op := store.Operator()
	list, err := op.List(ctx, pgstore.Filter{Tenant: "acme", State: pgstore.StatePending})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("listed:", len(list), list[0].ID == task.ID)
	cancelled, err := op.Cancel(ctx, task.ID)
	fmt.Println(cancelled.State, err)
	_, err = op.Retry(ctx, task.ID) // only a failed task runs again
	fmt.Println("retry a cancelled task:", errors.Is(err, pgstore.ErrNotRecoverable))
	// Output:
	// image: 1 pending, paused true, max running 8
	// listed: 1 true
	// cancelled <nil>
	// retry a cancelled task: true
}
