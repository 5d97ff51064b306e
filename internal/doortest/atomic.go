package doortest

import (
	"context"
	"net/http"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/pgrecords"
)

// testAtomic, on pgrecords only (Atomic needs a TxStore): on an Atomic route the handler's writes
// through the request's transaction commit with the stored answer, or not
// at all: a 5xx rolls them back and releases the key, the retry's writes
// commit with its answer, and the replay writes nothing. A request
// without a key runs in a transaction too, which commits its writes.
func testAtomic(t *testing.T, b bundle) {
	s := b.serve(t, func(c *Config) { c.Atomic = true }, func(w http.ResponseWriter, r *http.Request, n int64) {
		tx := pgrecords.TxFromContext(r.Context())
		if tx == nil {
			http.Error(w, "no transaction", http.StatusInternalServerError)
			return
		}
		if _, err := tx.Exec(r.Context(), `INSERT INTO doortest_writes (tenant, run) VALUES ($1, $2)`, r.Header.Get("X-Tenant"), n); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if n == 1 {
			answer(http.StatusInternalServerError, "failed after the write")(w, r, n)
			return
		}
		defaultHandler(w, r, n)
	})
	want{status: 500, calls: 1, body: "failed after the write 1"}.check(t, s, s.do(t, req{key: "k", body: imageBody}))
	want{status: 201, calls: 2}.check(t, s, s.do(t, req{key: "k", body: imageBody}))
	want{status: 201, calls: 2, replayed: true, body: `{"run":2,"got":` + imageBody + `}`}.check(t, s, s.do(t, req{key: "k", body: imageBody}))
	want{status: 201, calls: 3}.check(t, s, s.do(t, req{body: imageBody}))
	rows, err := b.pool.Query(context.Background(), `SELECT run FROM doortest_writes WHERE tenant = $1 ORDER BY run`, s.tenant)
	if err != nil {
		t.Fatal(err)
	}
	runs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{2, 3}; !slices.Equal(runs, want) {
		t.Errorf("committed writes of runs %v, want %v: the failed run's write rolled back, the stored run's and the keyless run's committed", runs, want)
	}
}
