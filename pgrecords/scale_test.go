package pgrecords_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
)

// TestScale measures pgrecords' claim of a new key and replay of a
// finished one (p50/p99) beside 10k records and beside 10M (1M with
// PGRECORDS_SCALE=quick), each as a ratio of the 10k table's, measured in
// the same run, and the sweep's rate on the large table. The records are
// copies of one real record (its ident, sums and a 200-byte response)
// under other keys, loaded with generate_series. Not part of make test.
//
//	PGRECORDS_SCALE=1 go test -count=1 -v -timeout 2h -run '^TestScale$' ./pgrecords/
//	PGRECORDS_SCALE=quick go test -count=1 -v -timeout 1h -run '^TestScale$' ./pgrecords/
func TestScale(t *testing.T) {
	mode := os.Getenv("PGRECORDS_SCALE")
	if mode == "" {
		t.Skip("set PGRECORDS_SCALE=1 (or quick) to measure (with -v)")
	}
	big := 10_000_000
	if mode == "quick" {
		big = 1_000_000
	}
	const samples = 300
	type result struct{ claim50, claim99, replay50, replay99 time.Duration }
	var small result
	var lines []string
	for _, n := range []int{10_000, big} {
		ctx := context.Background()
		pool, err := pgxpool.New(ctx, testenv.PostgresDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		s, err := pgrecords.New(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		req := func() middleware.ClaimRequest {
			var tok middleware.Token
			_, _ = rand.Read(tok[:])
			return middleware.ClaimRequest{Fingerprint: "v1:scale", Owner: "owner", Kind: "orders",
				Lease: time.Minute, Token: tok}
		}
		tmpl := req()
		if _, err := s.Claim(ctx, "template", tmpl); err != nil {
			t.Fatal(err)
		}
		resp := middleware.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
			Body: []byte(strings.Repeat("x", 200))}
		if err := s.Complete(ctx, "template", tmpl.Token, resp, 24*time.Hour); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for from := 0; from < n; from += 1_000_000 {
			if _, err := pool.Exec(ctx, `INSERT INTO idemgate_records (key, token, finished, expires_at, ident, sums, response)
				SELECT 'k-' || g, r.token, r.finished, r.expires_at, r.ident, r.sums, r.response
				FROM idemgate_records r, generate_series($1::int, $2::int - 1) g WHERE r.key = 'template'`,
				from, min(n, from+1_000_000)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := pool.Exec(ctx, "VACUUM ANALYZE idemgate_records"); err != nil {
			t.Fatal(err)
		}
		t.Logf("%d records loaded in %v", n, time.Since(start).Round(time.Second))
		var r result
		var claims, replays []time.Duration
		for i := range samples {
			begin := time.Now()
			res, err := s.Claim(ctx, fmt.Sprintf("new-%d", i), req())
			if err != nil || res.Status != middleware.Claimed {
				t.Fatalf("claim of a new key: %+v, %v", res, err)
			}
			claims = append(claims, time.Since(begin))
			k, _ := rand.Int(rand.Reader, bigInt(n))
			begin = time.Now()
			res, err = s.Claim(ctx, fmt.Sprintf("k-%d", k.Int64()), req())
			if err != nil || res.Status != middleware.Finished {
				t.Fatalf("replay: %+v, %v", res, err)
			}
			replays = append(replays, time.Since(begin))
		}
		r.claim50, r.claim99 = pct(claims)
		r.replay50, r.replay99 = pct(replays)
		if n == 10_000 {
			small = r
		}
		var size int64
		if err := pool.QueryRow(ctx, "SELECT pg_total_relation_size('idemgate_records')").Scan(&size); err != nil {
			t.Fatal(err)
		}
		line := fmt.Sprintf("| %d records (%d bytes each, with the index) | claim %.2f / %.2f ms (%.2f× / %.2f×) | replay %.2f / %.2f ms (%.2f× / %.2f×) | %s |",
			n, size/int64(n+1), msOf(r.claim50), msOf(r.claim99), ratioOf(r.claim50, small.claim50),
			ratioOf(r.claim99, small.claim99), msOf(r.replay50), msOf(r.replay99), ratioOf(r.replay50, small.replay50),
			ratioOf(r.replay99, small.replay99), load())
		t.Log(line)
		lines = append(lines, line)
		if n != big {
			continue
		}
		// The sweep's rate: 100k records expire, among the others.
		if _, err := pool.Exec(ctx, `UPDATE idemgate_records SET expires_at = now() - interval '1 second'
			WHERE key IN (SELECT 'k-' || g FROM generate_series(0, $1::int - 1, 10) g LIMIT 100000)`, n); err != nil {
			t.Fatal(err)
		}
		begin := time.Now()
		swept, err := s.Sweep(ctx)
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(begin)
		line = fmt.Sprintf("| sweep beside %d records | %d expired records deleted in %v = %.0f records/s | | %s |",
			n, swept, took.Round(time.Millisecond), float64(swept)/took.Seconds(), load())
		t.Log(line)
		lines = append(lines, line)
	}
	t.Logf("\n| table | claim of a new key p50 / p99 (vs 10k) | replay p50 / p99 (vs 10k) | load |\n|---|---|---|---|\n%s",
		strings.Join(lines, "\n"))
}

func bigInt(n int) *big.Int { return big.NewInt(int64(n)) }

func pct(d []time.Duration) (p50, p99 time.Duration) {
	slices.Sort(d)
	return d[len(d)/2], d[len(d)*99/100]
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ratioOf(a, b time.Duration) float64 { return float64(a) / float64(b) }

// load is the machine's one-minute load average, for the record.
func load() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return "load " + strings.Fields(string(b))[0]
}
