// Command churn measures how the records table holds up under a hot
// claim/complete load with sweeps: it runs -n claims (each completed, on a
// new key, or, for -reuse of them, on a key whose record has expired), with
// a short retention so that records expire as they go, sweeps every -sweep,
// and prints the table's live and dead tuples, its size and the share of
// HOT updates as it goes and at the end.
//
//	go run ./pgrecords/internal/churn -n 1000000
//
// Without DATABASE_URL it starts a throwaway PostgreSQL (removed on exit).
package main

import (
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/devserver"
	"github.com/idemgate/idemgate/pgrecords"
)

func main() {
	n := flag.Int("n", 1_000_000, "claims")
	conc := flag.Int("c", 16, "concurrent clients")
	retention := flag.Duration("retention", 5*time.Second, "retention of a finished record")
	sweep := flag.Duration("sweep", 2*time.Second, "sweep interval")
	reuse := flag.Float64("reuse", 0.1, "share of claims on a key whose record expired (reclaimed in place)")
	every := flag.Int("report", 100_000, "print the table's state every this many claims")
	flag.Parse()
	if err := run(*n, *conc, *retention, *sweep, *reuse, *every); err != nil {
		log.Fatal(err)
	}
}

func run(n, conc int, retention, sweepEvery time.Duration, reuse float64, every int) error {
	ctx := context.Background()
	dsn := os.Getenv("DATABASE_URL")
	if dsn == "" {
		pg, err := devserver.StartPostgres(ctx)
		if err != nil {
			return err
		}
		defer pg.Stop()
		dsn = pg.DSN("postgres")
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(conc + 2)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	s, err := pgrecords.New(ctx, pool)
	if err != nil {
		return err
	}
	if err := s.Migrate(ctx); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `TRUNCATE idemgate_records`); err != nil {
		return err
	}

	// Keys finished long enough ago to have expired, for reuse.
	var (
		mu  sync.Mutex
		old []string
	)
	resp := idemgate.Response{Status: 202, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"task_id":"0b7e1f9c-3d7a-4c1e-9a53-1f0f6a8d2b11","status":"queued","poll_after_ms":1000}`)}
	var done, swept, reclaimed atomic.Int64
	stopSweep := make(chan struct{})
	var sweepWG sync.WaitGroup
	sweepWG.Go(func() {
		t := time.NewTicker(sweepEvery)
		defer t.Stop()
		for {
			select {
			case <-stopSweep:
				return
			case <-t.C:
				k, err := s.Sweep(ctx)
				if err != nil {
					log.Print(err)
				}
				swept.Add(k)
			}
		}
	})
	start := time.Now()
	fmt.Printf("claims  elapsed  live  dead  table_bytes  total_bytes  upd  hot_upd  swept  reclaimed\n")
	var wg sync.WaitGroup
	for w := range conc {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			var b [16]byte
			for {
				i := done.Add(1)
				if i > int64(n) {
					return
				}
				var key string
				reused := false
				mu.Lock()
				if len(old) > 1000 && rng.Float64() < reuse {
					j := rng.IntN(len(old) / 2) // the older half: expired by now
					key = old[j]
					old[j] = old[len(old)-1]
					old = old[:len(old)-1]
					reused = true
				}
				mu.Unlock()
				if key == "" {
					for k := range b {
						b[k] = byte(rng.Uint32())
					}
					key = "idem:churn:image:" + hex.EncodeToString(b[:])
				}
				var tok idemgate.Token
				for k := range tok {
					tok[k] = byte(rng.Uint32())
				}
				req := idemgate.ClaimRequest{Fingerprint: "v1:" + "ab", Owner: "owner", Kind: "image", Lease: 30 * time.Second, Token: tok}
				res, err := s.Claim(ctx, key, req)
				if err != nil {
					log.Fatal(err)
				}
				if res.Status != idemgate.Claimed {
					continue // not yet expired: fine, counted as a claim attempt
				}
				if reused {
					reclaimed.Add(1)
				}
				if err := s.Complete(ctx, key, tok, resp, retention); err != nil {
					log.Fatal(err)
				}
				mu.Lock()
				if len(old) < 200_000 {
					old = append(old, key)
				}
				mu.Unlock()
				if i%int64(every) == 0 {
					report(ctx, pool, i, start, swept.Load(), reclaimed.Load())
				}
			}
		})
	}
	wg.Wait()
	close(stopSweep)
	sweepWG.Wait()
	report(ctx, pool, int64(n), start, swept.Load(), reclaimed.Load())
	var rows int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idemgate_records`).Scan(&rows); err != nil {
		return err
	}
	fmt.Printf("rows now: %d (records within retention + not yet swept)\n", rows)
	return nil
}

func report(ctx context.Context, pool *pgxpool.Pool, i int64, start time.Time, swept, reclaimed int64) {
	_, _ = pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
	var live, dead, upd, hot, table, total int64
	err := pool.QueryRow(ctx, `SELECT n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd,
		pg_relation_size('idemgate_records'), pg_total_relation_size('idemgate_records')
		FROM pg_stat_user_tables WHERE relname = 'idemgate_records'`).Scan(&live, &dead, &upd, &hot, &table, &total)
	if err != nil {
		log.Print(err)
		return
	}
	fmt.Printf("%d  %s  %d  %d  %d  %d  %d  %d  %d  %d\n", i, time.Since(start).Round(time.Second), live, dead, table, total, upd, hot, swept, reclaimed)
}
