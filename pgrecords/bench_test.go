package pgrecords_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
)

// BenchmarkReplay claims finished records: pgrecords' claim against its
// floor, one SELECT by primary key of the same row on a copy of the
// table (go test -run '^$' -bench Replay -benchmem ./pgrecords/). Run the
// two back to back and compare ns/op and allocs/op: both include the
// round trip to a server on the same machine.
func BenchmarkReplay(b *testing.B) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.PostgresDSN(b))
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	s, err := pgrecords.New(ctx, pool)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	const n = 1000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "idem:bench:" + strconv.Itoa(i)
		req := request(time.Hour)
		if _, err := s.Claim(ctx, keys[i], req); err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, keys[i], req.Token, sample(), time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	for _, sql := range []string{`CREATE TABLE floor (LIKE idemgate_records INCLUDING ALL)`,
		`INSERT INTO floor SELECT * FROM idemgate_records`, `VACUUM ANALYZE floor, idemgate_records`} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("pgrecords", func(b *testing.B) {
		req := request(time.Hour)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			res, err := s.Claim(ctx, keys[i%n], req)
			if err != nil || res.Status != middleware.Finished {
				b.Fatal(res.Status, err)
			}
		}
	})
	b.Run("floor", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			var (
				finished    bool
				ident, resp []byte
			)
			if err := pool.QueryRow(ctx, `SELECT finished, ident, response FROM floor WHERE key = $1`, keys[i%n]).
				Scan(&finished, &ident, &resp); err != nil || !finished {
				b.Fatal(err)
			}
		}
	})
}
