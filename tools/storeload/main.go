// Command storeload drives the records stores directly (no HTTP) and
// prints, per store and scenario, operations per second, round trips per
// request and server CPU per request: the Postgres store (pgrecords),
// its floor (the minimum statements on the same pool and a table of the
// same shape: INSERT … ON CONFLICT DO NOTHING + UPDATE by primary key for a
// miss, one SELECT by primary key for a replay) and the Redis store.
//
//	go run ./tools/storeload -d 5s -rounds 3
//
// A miss is a claim and a complete on a new key; a replay a claim of a
// finished key. It starts a throwaway PostgreSQL and redis-server (removed
// on exit; DATABASE_URL names a local server to use instead). Postgres CPU is the user+system time of every process of the
// throwaway server (backends and background workers, and those that exited
// during the run) from /proc (internal/pgcpu); Redis CPU from INFO cpu.
// Figures are medians of the rounds.
package main

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgate/idemgate/internal/pgtrace"
	"github.com/idemgate/idemgate/tools/internal/measure"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/devserver"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/redisstore"
	"github.com/idemgate/idemgate/tools/internal/pgcpu"
)

func main() {
	if err := mainErr(); err != nil {
		log.Fatal(err)
	}
}

func mainErr() error {
	d := flag.Duration("d", 5*time.Second, "duration of one round of one scenario")
	conc := flag.Int("c", 16, "concurrent clients")
	rounds := flag.Int("rounds", 3, "rounds (the median is printed)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of this process (the clients) to this file")
	flag.Parse()
	stop, err := measure.StartCPUProfile(*cpuprofile)
	if err != nil {
		return err
	}
	defer stop()
	return run(*d, *conc, *rounds)
}

// redisCounter counts commands sent to Redis.
type redisCounter struct{ n atomic.Int64 }

func (c *redisCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *redisCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.n.Add(1); return next(ctx, cmd) }
}
func (c *redisCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.n.Add(1); return next(ctx, cmds) }
}

// subject is one store under load.
type subject struct {
	name   string
	miss   func(ctx context.Context, key string, tok idemgate.Token) error
	replay func(ctx context.Context, key string, tok idemgate.Token) error
	trips  func() int64
	cpu    func() (time.Duration, error) // server CPU so far
}

var response = idemgate.Response{Status: 202, Header: http.Header{"Content-Type": {"application/json"}},
	Body: []byte(`{"task_id":"0b7e1f9c-3d7a-4c1e-9a53-1f0f6a8d2b11","status":"queued","poll_after_ms":1000}`)}

func claimRequest(tok idemgate.Token) idemgate.ClaimRequest {
	return idemgate.ClaimRequest{Fingerprint: "v1:" + "4f2a6b1c9d8e7f60a1b2c3d4e5f60718293a4b5c6d7e8f901a2b3c4d5e6f7081",
		Owner: "7d1e2f3a4b5c6d7e8f9012a3b4c5d6e7f8091a2b3c4d5e6f7a8b9c0d1e2f3a4b", Kind: "image", Lease: 30 * time.Second, Token: tok}
}

func storeSubject(name string, s idemgate.Store, trips func() int64, cpu func() (time.Duration, error)) subject {
	miss := func(ctx context.Context, key string, tok idemgate.Token) error {
		res, err := s.Claim(ctx, key, claimRequest(tok))
		if err != nil {
			return err
		}
		if res.Status != idemgate.Claimed {
			return fmt.Errorf("miss: claim %v", res.Status)
		}
		return s.Complete(ctx, key, tok, response, time.Hour)
	}
	return subject{
		name: name, trips: trips, cpu: cpu, miss: miss,
		replay: func(ctx context.Context, key string, tok idemgate.Token) error {
			res, err := s.Claim(ctx, key, claimRequest(tok))
			if err != nil {
				return err
			}
			if res.Status != idemgate.Finished || len(res.Response.Body) != len(response.Body) {
				return fmt.Errorf("replay: claim %v", res.Status)
			}
			return nil
		},
	}
}

// The floor's statements, on a table of pgrecords' shape: the fewest a
// store needs (it neither fences by token nor looks at expiry). A replay
// reads what it must compare (the ident) and what it replays.
const (
	sqlFloorTable  = `CREATE TABLE IF NOT EXISTS idemgate_records_floor (LIKE idemgate_records INCLUDING ALL) WITH (fillfactor = 70)`
	sqlFloorInsert = `INSERT INTO idemgate_records_floor (key, token, finished, expires_at, ident)
VALUES ($1, $2, false, now() + interval '30 seconds', $3) ON CONFLICT DO NOTHING`
	sqlFloorUpdate = `UPDATE idemgate_records_floor SET finished = true, expires_at = now() + interval '1 hour', response = $2 WHERE key = $1`
	sqlFloorSelect = `SELECT finished, ident, response FROM idemgate_records_floor WHERE key = $1`
)

// floorIdent is as long as pgrecords' ident of the same claim.
func floorIdent(req idemgate.ClaimRequest) []byte {
	return []byte("\x40" + req.Owner + "\x05" + req.Kind + string(req.Fingerprint))
}

func floorSubject(pool *pgxpool.Pool, trips func() int64, cpu func() (time.Duration, error)) subject {
	stored := []byte{0, 202, 1, 12, 'C', 'o', 'n', 't', 'e', 'n', 't', '-', 'T', 'y', 'p', 'e', 1, 16}
	stored = append(stored, "application/json"...)
	stored = append(stored, response.Body...)
	miss := func(ctx context.Context, key string, tok idemgate.Token) error {
		tag, err := pool.Exec(ctx, sqlFloorInsert, key, [16]byte(tok), floorIdent(claimRequest(tok)))
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return errors.New("floor miss: key exists")
		}
		_, err = pool.Exec(ctx, sqlFloorUpdate, key, stored)
		return err
	}
	return subject{
		name: "floor: INSERT ON CONFLICT DO NOTHING + UPDATE / SELECT", trips: trips, cpu: cpu, miss: miss,
		replay: func(ctx context.Context, key string, tok idemgate.Token) error {
			var (
				finished    bool
				ident, resp []byte
			)
			if err := pool.QueryRow(ctx, sqlFloorSelect, key).Scan(&finished, &ident, &resp); err != nil {
				return err
			}
			if !finished || string(ident) != string(floorIdent(claimRequest(tok))) || len(resp) != len(stored) {
				return errors.New("floor replay: wrong record")
			}
			return nil
		},
	}
}

func redisCPU(client *redis.Client) func() (time.Duration, error) {
	return func() (time.Duration, error) {
		info, err := client.Info(context.Background(), "cpu").Result()
		if err != nil {
			return 0, err
		}
		var total float64
		for _, line := range strings.Split(info, "\r\n") {
			name, v, ok := strings.Cut(line, ":")
			if ok && (name == "used_cpu_sys" || name == "used_cpu_user") {
				f, _ := strconv.ParseFloat(v, 64)
				total += f
			}
		}
		return time.Duration(total * float64(time.Second)), nil
	}
}

type result struct {
	ops, trips, cpuUS float64
}

func run(d time.Duration, conc, rounds int) error {
	ctx := context.Background()
	dsn := os.Getenv("DATABASE_URL") // a local server: its CPU is read from /proc
	if dsn == "" {
		pg, err := devserver.StartPostgres(ctx)
		if err != nil {
			return err
		}
		defer pg.Stop()
		dsn = pg.DSN("postgres")
	}
	rd, err := devserver.StartRedis(ctx, 1)
	if err != nil {
		return err
	}
	defer rd.Stop()

	var pc pgtrace.RoundTrips
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(conc)
	cfg.MinConns = int32(conc)
	cfg.ConnConfig.Tracer = &pc
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := pgrecords.New(ctx, pool)
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, sqlFloorTable); err != nil {
		return err
	}
	pgServer, err := pgcpu.Find(ctx, pool)
	if err != nil {
		return err
	}

	var rc redisCounter
	client := redis.NewClient(&redis.Options{Addr: rd.Addr, PoolSize: conc})
	defer client.Close()
	client.AddHook(&rc)

	subjects := []subject{
		floorSubject(pool, pc.Load, pgServer.Used),
		storeSubject("pgrecords", store, pc.Load, pgServer.Used),
		storeSubject("redis store (redis-server "+rd.Addr+")", redisstore.New(client), rc.n.Load, redisCPU(client)),
	}
	fmt.Printf("%d clients, %v per round, median of %d rounds\n\n", conc, d, rounds)
	fmt.Printf("| store | miss/s | replay/s | round trips miss / replay | server CPU µs/miss | server CPU µs/replay |\n|---|---|---|---|---|---|\n")
	// Rounds alternate between the stores, so each meets the same
	// background load.
	miss := make([][]result, len(subjects))
	replay := make([][]result, len(subjects))
	for r := range rounds {
		for i, s := range subjects {
			prefix := fmt.Sprintf("idem:load:image:%d:%d:", i, r)
			m, keys, err := drive(ctx, s, s.miss, prefix+"m", nil, d, conc)
			if err != nil {
				return fmt.Errorf("%s miss: %w", s.name, err)
			}
			miss[i] = append(miss[i], m)
			rp, _, err := drive(ctx, s, s.replay, "", keys, d, conc)
			if err != nil {
				return fmt.Errorf("%s replay: %w", s.name, err)
			}
			replay[i] = append(replay[i], rp)
		}
	}
	results := make([][2]result, len(subjects))
	for i, s := range subjects {
		results[i] = [2]result{median(miss[i]), median(replay[i])}
		m, r := results[i][0], results[i][1]
		fmt.Printf("| %s | %.0f | %.0f | %.2f / %.2f | %.1f | %.1f |\n", s.name, m.ops, r.ops, m.trips, r.trips, m.cpuUS, r.cpuUS)
	}
	f, p := results[0], results[1]
	fmt.Printf("\npgrecords / floor: miss %.2f×, replay %.2f×\n", p[0].ops/f[0].ops, p[1].ops/f[1].ops)
	return nil
}

func median(rs []result) result {
	pick := func(get func(result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = get(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	return result{
		ops:   pick(func(r result) float64 { return r.ops }),
		trips: pick(func(r result) float64 { return r.trips }),
		cpuUS: pick(func(r result) float64 { return r.cpuUS }),
	}
}

// drive runs op from conc goroutines for d: on new keys under prefix (a
// miss), or on keys (a replay, each goroutine cycling through its share).
// It returns the keys it made.
func drive(ctx context.Context, s subject, op func(context.Context, string, idemgate.Token) error,
	prefix string, keys []string, d time.Duration, conc int) (result, []string, error) {
	var (
		n     atomic.Int64
		mu    sync.Mutex
		made  []string
		first error
		wg    sync.WaitGroup
	)
	trips0 := s.trips()
	cpu0, err := s.cpu()
	if err != nil {
		return result{}, nil, err
	}
	start := time.Now()
	deadline := start.Add(d)
	for w := range conc {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			var mine []string
			for i := 0; time.Now().Before(deadline); i++ {
				var tok idemgate.Token
				for k := range tok {
					tok[k] = byte(rng.Uint32())
				}
				var key string
				if keys == nil {
					key = prefix + strconv.Itoa(w) + ":" + strconv.Itoa(i) + ":" + hex.EncodeToString(tok[:4])
				} else {
					key = keys[(w+i*conc)%len(keys)]
				}
				if err := op(ctx, key, tok); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
				n.Add(1)
				if keys == nil {
					mine = append(mine, key)
				}
			}
			mu.Lock()
			made = append(made, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if first != nil {
		return result{}, nil, first
	}
	cpu1, err := s.cpu()
	if err != nil {
		return result{}, nil, err
	}
	ops := float64(n.Load())
	return result{
		ops:   ops / elapsed.Seconds(),
		trips: float64(s.trips()-trips0) / ops,
		cpuUS: float64((cpu1 - cpu0).Microseconds()) / ops,
	}, made, nil
}
