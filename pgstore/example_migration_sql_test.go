package pgstore_test

import (
	"fmt"
	"strings"

	"github.com/idemgate/idemgate/pgstore"
)

// A migration tool that runs DDL itself (goose, atlas, a DBA with psql)
// takes the schema as SQL: each version starts with a marker line that
// says whether it is one transaction or statements to run on their own.
func ExampleMigrationSQL() {
	versions := 0
	for line := range strings.Lines(pgstore.MigrationSQL()) {
		if strings.HasPrefix(line, "-- idemgate:begin ") {
			if versions < 2 {
				fmt.Print(line)
			}
			versions++
		}
	}
	// Output:
	// -- idemgate:begin pgstore v1 transaction: create tasks with the narrow key (tenant, idempotency_key)
	// -- idemgate:begin pgstore v2 no-transaction: widen the key to (tenant, idempotency_key, runtime, network)
}
