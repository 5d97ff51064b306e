package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/pgrecords"
)

// recordResponse is every measured record's answer: a small JSON reply.
var recordResponse = idemgate.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
	Body: []byte(`{"id":"` + strings.Repeat("x", 190) + `"}`)}

func claimRequest() idemgate.ClaimRequest {
	var tok idemgate.Token
	_, _ = rand.Read(tok[:])
	return idemgate.ClaimRequest{Fingerprint: "v1:scale", Owner: "owner", Kind: "orders", Lease: time.Minute, Token: tok}
}

// measureRecords times pgrecords' claim of a new key and replay of a
// finished one beside each of sz.Records records, and the sweep of
// sz.Expired expired records spread through the largest table.
func measureRecords(ctx context.Context, out, log io.Writer, pg *postgres, sz sizes) error {
	fmt.Fprintf(out, "pgrecords: claim of a new key and replay of a random finished one, %d of each; ratios against %d records\n\n", sz.Samples, sz.Records[0])
	fmt.Fprintln(out, "| records | bytes a record (table and index) | claim p50 / p99 ms | ratio | replay p50 / p99 ms | ratio | target (p50s) | load |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|---|---|")
	var base [2]time.Duration
	var sweep string
	for i, n := range sz.Records {
		large := i == len(sz.Records)-1 && i > 0
		expiredEvery := 0
		if large && sz.Expired > 0 {
			expiredEvery = max(1, n/sz.Expired)
		}
		r, err := recordsTable(ctx, log, pg, n, expiredEvery, sz.Samples)
		if err != nil {
			return fmt.Errorf("%d records: %w", n, err)
		}
		c50, r50 := r.claims.p(0.5), r.replays.p(0.5)
		if i == 0 {
			base = [2]time.Duration{c50, r50}
		}
		target := 1.5
		if large {
			target = 2
		}
		fmt.Fprintf(out, "| %d | %d | %s / %s | %.2f× | %s / %s | %.2f× | %s | %s |\n", n, r.bytesPer,
			ms(c50), ms(r.claims.p(0.99)), ratio(c50, base[0]), ms(r50), ms(r.replays.p(0.99)), ratio(r50, base[1]),
			verdict(max(ratio(c50, base[0]), ratio(r50, base[1])), target), r.load)
		if r.swept > 0 {
			sweep = fmt.Sprintf("sweep beside %d records: %d expired records deleted in %v, %.0f records/s (load %s)",
				n, r.swept, r.sweepTook.Round(time.Millisecond), float64(r.swept)/r.sweepTook.Seconds(), r.sweepLoad)
		}
	}
	if sweep != "" {
		fmt.Fprintf(out, "\n%s\n", sweep)
	}
	fmt.Fprintln(out)
	return nil
}

type recordsResult struct {
	claims, replays latencies
	bytesPer        int64
	load            string
	swept           int64
	sweepTook       time.Duration
	sweepLoad       string
}

// recordsTable builds a table of n finished records (every expiredEvery-th
// one expired, when not 0), times claims and replays, then sweeps.
func recordsTable(ctx context.Context, log io.Writer, pg *postgres, n, expiredEvery, samples int) (recordsResult, error) {
	var r recordsResult
	pool, drop, err := pg.database(ctx)
	if err != nil {
		return r, err
	}
	defer drop()
	s, err := pgrecords.New(ctx, pool)
	if err != nil {
		return r, err
	}
	// Two records as the store writes them: one finished for a day, one
	// whose retention has already run out.
	for _, t := range []struct {
		key       string
		retention time.Duration
	}{{"template", 24 * time.Hour}, {"expired-template", time.Millisecond}} {
		req := claimRequest()
		if _, err := s.Claim(ctx, t.key, req); err != nil {
			return r, err
		}
		if err := s.Complete(ctx, t.key, req.Token, recordResponse, t.retention); err != nil {
			return r, err
		}
	}
	time.Sleep(20 * time.Millisecond) // the expired template's millisecond
	start := time.Now()
	if err := copyRecords(ctx, pool, n, expiredEvery); err != nil {
		return r, err
	}
	fmt.Fprintf(log, "scale: %d records loaded in %v (load %s)\n", n, time.Since(start).Round(time.Second), loadAvg())
	var size int64
	if err := pool.QueryRow(ctx, "SELECT pg_total_relation_size('idemgate_records')").Scan(&size); err != nil {
		return r, err
	}
	r.bytesPer = size / int64(n+2)
	for i := range warmup(samples) + samples {
		begin := time.Now()
		res, err := s.Claim(ctx, fmt.Sprintf("new-%d", i), claimRequest())
		if err != nil || res.Status != idemgate.Claimed {
			return r, fmt.Errorf("claim of a new key: %+v, %w", res.Status, err)
		}
		took := time.Since(begin)
		k := mrand.IntN(n)
		for expiredEvery > 0 && k%expiredEvery == 0 {
			k = mrand.IntN(n)
		}
		begin = time.Now()
		res, err = s.Claim(ctx, fmt.Sprintf("k-%d", k), claimRequest())
		if err != nil || res.Status != idemgate.Finished {
			return r, fmt.Errorf("replay of k-%d: %+v, %w", k, res.Status, err)
		}
		if i >= warmup(samples) {
			r.claims = append(r.claims, took)
			r.replays = append(r.replays, time.Since(begin))
		}
	}
	r.load = loadAvg()
	if expiredEvery == 0 {
		return r, nil
	}
	want := int64((n-1)/expiredEvery + 2) // k-0, k-every, …, and the expired template
	begin := time.Now()
	if r.swept, err = s.Sweep(ctx); err != nil {
		return r, err
	}
	r.sweepTook, r.sweepLoad = time.Since(begin), loadAvg()
	if r.swept != want {
		return r, fmt.Errorf("sweep deleted %d records, want the %d expired ones", r.swept, want)
	}
	return r, nil
}

// copyRecords writes n copies of the template record under the keys k-0
// … k-(n-1), a copy of the expired one at every expiredEvery-th key, a
// million rows a statement. Each copy is the stored row with its key
// replaced, whatever columns the table has, so the records are exactly
// what the store writes.
func copyRecords(ctx context.Context, pool *pgxpool.Pool, n, expiredEvery int) error {
	const batch = 1_000_000
	for from := 0; from < n; from += batch {
		if _, err := pool.Exec(ctx, `INSERT INTO idemgate_records
			SELECT (jsonb_populate_record(CASE WHEN $3::int > 0 AND g % $3::int = 0 THEN e ELSE r END,
				jsonb_build_object('key', 'k-' || g))).*
			FROM idemgate_records r, idemgate_records e, generate_series($1::int, $2::int - 1) g
			WHERE r.key = 'template' AND e.key = 'expired-template'`,
			from, min(n, from+batch), expiredEvery); err != nil {
			return fmt.Errorf("copy records: %w", err)
		}
	}
	// As autovacuum would leave a table this size: its statistics
	// gathered and its pages' visibility set, so the first reads do not
	// pay for the load.
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE idemgate_records"); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	return nil
}
