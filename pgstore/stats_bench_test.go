package pgstore

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// BenchmarkStatsMillion times Stats on a tasks table of a million rows
// and more, built with one generate_series INSERT per shape (it takes
// tens of seconds, which is why it is a benchmark and not a test):
//
//   - finished: 1M finished tasks (the usual table: Prune keeps some
//     days of history) and 10k unfinished ones in every state;
//   - backlog: 1M pending tasks of 4 kinds, a queue far behind.
//
// Run: go test -run '^$' -bench BenchmarkStatsMillion -benchtime 20x ./pgstore/
func BenchmarkStatsMillion(b *testing.B) {
	shapes := []struct {
		name string
		fill string
		want int // unfinished tasks Stats must count
	}{
		{"finished", `INSERT INTO idemgate_tasks
	(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, state, finished_at, created_at, run_after)
SELECT 'acme', 'o', 'kind-' || g % 4, 'gpu', 'main', 'done-' || g, 'f',
	(ARRAY['succeeded', 'failed', 'cancelled'])[1 + g % 3], now() - g * interval '1 second',
	now() - g * interval '1 second', now() - g * interval '1 second'
FROM generate_series(1, 1000000) g;
INSERT INTO idemgate_tasks
	(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, state, lease_until, run_after, priority)
SELECT 'acme', 'o', 'kind-' || g % 4, 'gpu', 'main', 'open-' || g, 'f',
	(ARRAY['pending', 'running', 'retrying', 'uncertain'])[1 + g % 4],
	CASE WHEN g % 4 = 1 THEN now() + interval '1 minute' END, now() - g * interval '1 second', g % 3
FROM generate_series(1, 10000) g`, 10000},
		{"backlog", `INSERT INTO idemgate_tasks
	(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after, priority)
SELECT 'acme', 'o', 'kind-' || g % 4, 'gpu', 'main', 'open-' || g, 'f', now() - g * interval '1 second', g % 3
FROM generate_series(1, 1000000) g`, 1000000},
	}
	for _, shape := range shapes {
		b.Run(shape.name, func(b *testing.B) {
			s, _ := setup(b)
			ctx := context.Background()
			for _, sql := range []string{shape.fill, "VACUUM ANALYZE idemgate_tasks"} {
				if _, err := s.pool.Exec(ctx, sql); err != nil {
					b.Fatal(err)
				}
			}
			var rows int
			if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM idemgate_tasks").Scan(&rows); err != nil {
				b.Fatal(err)
			}
			lines, _ := s.pool.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT TEXT) "+sqlStats)
			plan, err := pgx.CollectRows(lines, pgx.RowTo[string])
			if err != nil {
				b.Fatal(err)
			}
			var scans []string // the plan's scan nodes: what Stats reads
			for _, line := range plan {
				if strings.Contains(line, "Scan") {
					scans = append(scans, strings.TrimSpace(line))
				}
			}
			b.Logf("%d rows; Stats reads:\n%s", rows, strings.Join(scans, "\n"))
			b.ResetTimer()
			for b.Loop() {
				st, err := s.Stats(ctx)
				if err != nil {
					b.Fatal(err)
				}
				n := 0
				for _, byState := range st.Counts {
					for _, c := range byState {
						n += c
					}
				}
				if n != shape.want {
					b.Fatalf("Stats counted %d unfinished tasks, want %d", n, shape.want)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/call")
		})
	}
}
