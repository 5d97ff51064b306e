package main

import (
	"context"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/devserver"
	"github.com/idemgate/idemgate/redisstore"
)

// measureRedis times the Redis store's replay beside each of
// sz.RedisRecords finished records, on a real redis-server, and says the
// memory a record takes.
func measureRedis(ctx context.Context, out, log io.Writer, url string, sz sizes) error {
	opts := &redis.Options{}
	if url == "" {
		srv, err := devserver.StartRedis(ctx, 0)
		if err != nil {
			return err
		}
		defer func() { _ = srv.Stop() }()
		opts.Addr = srv.Addr
	} else {
		var err error
		if opts, err = redis.ParseURL(url); err != nil {
			return err
		}
	}
	client := redis.NewClient(opts)
	defer client.Close()
	s := redisstore.New(client)
	// One record as the store writes it, copied under other keys.
	const prefix = "scale:"
	tmpl := claimRequest()
	if _, err := s.Claim(ctx, prefix+"template", tmpl); err != nil {
		return err
	}
	if err := s.Complete(ctx, prefix+"template", tmpl.Token, recordResponse, 24*time.Hour); err != nil {
		return err
	}
	value, err := client.Get(ctx, prefix+"template").Result()
	if err != nil {
		return fmt.Errorf("the stored record is not one string (the copies would not be what the store writes): %w", err)
	}
	fmt.Fprintf(out, "Redis store: replay of a random finished record, %d of them; ratios against %d records\n\n", sz.Samples, sz.RedisRecords[0])
	fmt.Fprintln(out, "| records | bytes a record (used_memory) | replay p50 / p99 ms | ratio | target (p50) | load |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|")
	var base time.Duration
	loaded, written := 0, 0
	if url != "" {
		// A server of the user's: the copies go once measured (a
		// throwaway server goes whole).
		defer func() {
			if err := unlinkCopies(context.WithoutCancel(ctx), client, prefix, written); err != nil {
				fmt.Fprintln(log, "scale: remove the Redis records it wrote:", err)
			}
		}()
	}
	for i, n := range sz.RedisRecords {
		before, err := usedMemory(ctx, client)
		if err != nil {
			return err
		}
		start := time.Now()
		for from := loaded; from < n; from += 10_000 {
			pipe := client.Pipeline()
			for k := from; k < min(n, from+10_000); k++ {
				pipe.Set(ctx, prefix+"k-"+strconv.Itoa(k), value, 24*time.Hour)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				return err
			}
			written = min(n, from+10_000)
		}
		after, err := usedMemory(ctx, client)
		if err != nil {
			return err
		}
		fmt.Fprintf(log, "scale: %d Redis records written in %v (load %s)\n", n-loaded, time.Since(start).Round(time.Second), loadAvg())
		perRecord := (after - before) / int64(n-loaded)
		loaded = n
		var replays latencies
		for i := range warmup(sz.Samples) + sz.Samples {
			k := mrand.IntN(n)
			begin := time.Now()
			res, err := s.Claim(ctx, prefix+"k-"+strconv.Itoa(k), claimRequest())
			if err != nil || res.Status != idemgate.Finished {
				return fmt.Errorf("replay of k-%d: %v, %w", k, res.Status, err)
			}
			if i >= warmup(sz.Samples) {
				replays = append(replays, time.Since(begin))
			}
		}
		p50 := replays.p(0.5)
		if i == 0 {
			base = p50
		}
		target := 1.5
		if i == len(sz.RedisRecords)-1 && i > 0 {
			target = 2
		}
		fmt.Fprintf(out, "| %d | %d | %s / %s | %.2f× | %s | %s |\n", n, perRecord, ms(p50), ms(replays.p(0.99)),
			ratio(p50, base), verdict(ratio(p50, base), target), loadAvg())
	}
	fmt.Fprintln(out)
	return nil
}

// usedMemory is the server's used_memory (INFO memory).
func usedMemory(ctx context.Context, c *redis.Client) (int64, error) {
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(l, "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("no used_memory in INFO memory")
}

// unlinkCopies removes the n copies and the template written under
// prefix.
func unlinkCopies(ctx context.Context, c *redis.Client, prefix string, n int) error {
	for from := 0; from < n; from += 10_000 {
		pipe := c.Pipeline()
		for k := from; k < min(n, from+10_000); k++ {
			pipe.Unlink(ctx, prefix+"k-"+strconv.Itoa(k))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
	}
	return c.Unlink(ctx, prefix+"template").Err()
}
