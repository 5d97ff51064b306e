package middleware

import (
	"context"
	"crypto/rand"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/internal/testenv"
)

// TestRedisScale measures the Redis store's memory per finished record
// and its replay (p50/p99) beside 10k records and beside 10M (1M with
// REDIS_SCALE=quick) on a real redis-server, the replay as a ratio of the
// 10k one's, measured in the same run. The records are copies of one real
// record (a 200-byte response) under other keys, written in pipelines.
// Not part of make test.
//
//	REDIS_SCALE=1 go test -count=1 -v -timeout 1h -run '^TestRedisScale$' ./middleware/
//	REDIS_SCALE=quick go test -count=1 -v -timeout 1h -run '^TestRedisScale$' ./middleware/
func TestRedisScale(t *testing.T) {
	mode := os.Getenv("REDIS_SCALE")
	if mode == "" {
		t.Skip("set REDIS_SCALE=1 (or quick) to measure (with -v)")
	}
	large := 10_000_000
	if mode == "quick" {
		large = 1_000_000
	}
	ctx := context.Background()
	client := redis.NewClient(testenv.Redis(t))
	defer client.Close()
	s := NewRedisStore(client)
	req := func() ClaimRequest {
		return ClaimRequest{Fingerprint: "v1:scale", Owner: "owner", Kind: "orders", Lease: time.Minute, Token: newToken()}
	}
	tmpl := req()
	if _, err := s.Claim(ctx, "scale:template", tmpl); err != nil {
		t.Fatal(err)
	}
	resp := Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(strings.Repeat("x", 200))}
	if err := s.Complete(ctx, "scale:template", tmpl.Token, resp, 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	value, err := client.Get(ctx, "scale:template").Result()
	if err != nil {
		t.Fatal(err)
	}
	used := func() int64 {
		info, err := client.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(l, "used_memory:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		t.Fatal("no used_memory in INFO memory")
		return 0
	}
	var small time.Duration
	var lines []string
	loaded := 0
	for _, n := range []int{10_000, large} {
		before := used()
		start := time.Now()
		for from := loaded; from < n; from += 10_000 {
			pipe := client.Pipeline()
			for i := from; i < min(n, from+10_000); i++ {
				pipe.Set(ctx, "scale:k-"+strconv.Itoa(i), value, 24*time.Hour)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
		perRecord := float64(used()-before) / float64(n-loaded)
		t.Logf("%d records written in %v", n-loaded, time.Since(start).Round(time.Second))
		loaded = n
		var replays []time.Duration
		for range 1000 {
			k, _ := rand.Int(rand.Reader, big.NewInt(int64(n)))
			begin := time.Now()
			res, err := s.Claim(ctx, "scale:k-"+k.String(), req())
			if err != nil || res.Status != Finished {
				t.Fatalf("replay: %+v, %v", res, err)
			}
			replays = append(replays, time.Since(begin))
		}
		slices.Sort(replays)
		p50, p99 := replays[len(replays)/2], replays[len(replays)*99/100]
		if n == 10_000 {
			small = p50
		}
		b, _ := os.ReadFile("/proc/loadavg")
		line := fmt.Sprintf("| %d records | %.0f bytes a record (used_memory) | replay p50 %.3f ms (%.2f×), p99 %.3f ms | load %s |",
			n, perRecord, float64(p50)/1e6, float64(p50)/float64(small), float64(p99)/1e6, strings.Fields(string(b))[0])
		t.Log(line)
		lines = append(lines, line)
	}
	t.Logf("\n%s", strings.Join(lines, "\n"))
}
