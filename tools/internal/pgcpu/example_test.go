package pgcpu_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/tools/internal/pgcpu"
)

// Server CPU per request: read Used before and after the requests.
func ExampleFind() {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close(ctx)
	srv, err := pgcpu.Find(ctx, conn)
	if err != nil {
		fmt.Println("server CPU not measurable:", err)
		return
	}
	before, _ := srv.Used()
	const requests = 1000
	for range requests {
		conn.Exec(ctx, `SELECT 1`)
	}
	after, _ := srv.Used()
	fmt.Printf("%v of server CPU per request\n", (after-before)/requests)
}
