package idemgate_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/keyspace"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/redisstore"
)

// A queue consumer: each message is delivered at least once, and its
// effect happens once per message id. A redelivery gets the stored
// result; the same id with another amount is refused.
func ExampleRunner_Do() {
	mr, err := miniredis.Run() // yours: a real Redis
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()

	r := idemgate.Runner{Store: redisstore.New(client), Kind: "charge"}
	r.Fingerprint.Fields = []string{"/amount"}
	handle := func(ctx context.Context, id string, body []byte) {
		scope := keyspace.Scope{Tenant: "acme", User: "billing-worker", Request: id}
		res, err := r.Do(ctx, scope, body, func(ctx context.Context) ([]byte, error) {
			fmt.Println("charging", string(body)) // the effect: once per message id
			return []byte(`{"charge":"ch_1"}`), nil
		})
		switch {
		case errors.Is(err, idemgate.ErrKeyReused):
			fmt.Println("refused:", err) // ack it: a redelivery would be refused again
		case errors.Is(err, idemgate.ErrInProgress):
			fmt.Println("another worker runs it; redeliver later")
		case err != nil:
			fmt.Println("failed, redeliver:", err)
		default:
			fmt.Printf("done %s replayed=%v\n", res.Value, res.Replayed)
		}
	}
	ctx := context.Background()
	handle(ctx, "msg-1", []byte(`{"amount":100}`))
	handle(ctx, "msg-1", []byte(`{"amount":100}`)) // redelivered
	handle(ctx, "msg-1", []byte(`{"amount":250}`)) // a bug upstream reused the id
	// Output:
	// charging {"amount":100}
	// done {"charge":"ch_1"} replayed=false
	// done {"charge":"ch_1"} replayed=true
	// refused: idemgate: idempotency key reused with other parameters (changed: /amount)
}

// An exactly-once consumer on PostgreSQL: fn's writes, through the
// transaction that pgrecords.TxFromContext returns, and the stored result
// commit in one transaction. A worker that crashes inside fn leaves
// nothing; a redelivery after fn committed writes nothing again.
func ExampleRunner_Do_atomic() {
	databaseURL, drop := testenv.ExampleDatabase() // yours: os.Getenv("DATABASE_URL")
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close() // before drop
	records, err := pgrecords.New(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	if err := records.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (message text PRIMARY KEY, amount int NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	r := idemgate.Runner{Store: records, Kind: "book", Atomic: true}
	book := func(id string, amount int) {
		scope := keyspace.Scope{Tenant: "acme", User: "ledger-worker", Request: id}
		params := fmt.Appendf(nil, `{"amount":%d}`, amount)
		res, err := r.Do(ctx, scope, params, func(ctx context.Context) ([]byte, error) {
			tx := pgrecords.TxFromContext(ctx)
			if _, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, $2)`, id, amount); err != nil {
				return nil, err
			}
			return []byte("booked"), nil
		})
		fmt.Printf("%s: %s replayed=%v err=%v\n", id, res.Value, res.Replayed, err)
	}
	book("msg-1", 100)
	book("msg-1", 100) // redelivered

	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&rows); err != nil {
		log.Fatal(err)
	}
	fmt.Println("ledger rows:", rows)
	// Output:
	// msg-1: booked replayed=false err=<nil>
	// msg-1: booked replayed=true err=<nil>
	// ledger rows: 1
}
