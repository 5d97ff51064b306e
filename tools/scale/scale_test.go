package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/internal/devserver"
)

// TestRunTiny runs every part of the command on tiny queues and tables
// against real servers: each row is built, measured and printed. The
// command fails on its own checks (a claim that took nothing when it
// should, a replay that found no record, a sweep that deleted other
// than the expired records), so this keeps it from rotting as the
// stores change.
func TestRunTiny(t *testing.T) {
	var out bytes.Buffer
	sz := tinySizes()
	if err := run(context.Background(), &out, environment{log: testLog(t)}, sz, parts); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := out.String()
	t.Log("\n" + got)
	rows := func(header string) []string {
		_, table, ok := strings.Cut(got, header)
		if !ok {
			t.Fatalf("no table %q", header)
		}
		var rs []string
		for _, l := range strings.Split(table, "\n")[2:] {
			if !strings.HasPrefix(l, "| ") {
				break
			}
			rs = append(rs, l)
		}
		return rs
	}
	tests := []struct {
		name   string
		header string
		want   int
	}{
		{"queue", "| queue |", len(queueCases(sz))},
		{"records", "| records | bytes a record (table and index) |", len(sz.Records)},
		{"redis", "| records | bytes a record (used_memory) |", len(sz.RedisRecords)},
	}
	for _, tt := range tests {
		rs := rows(tt.header)
		if len(rs) != tt.want {
			t.Errorf("%s: %d rows, want %d", tt.name, len(rs), tt.want)
			continue
		}
		if tt.name != "queue" && !strings.Contains(rs[0], "| 1.00× |") {
			t.Errorf("%s: the baseline row is not 1.00× of itself: %s", tt.name, rs[0])
		}
	}
	for _, want := range []string{"capped claim against the uncapped one", "sweep beside 1000 records: 51 expired records deleted"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// TestRedisPartLeavesAUsersServerAsFound: with REDIS_URL the records go
// to a server the user runs; the copies must not stay there.
func TestRedisPartLeavesAUsersServerAsFound(t *testing.T) {
	ctx := context.Background()
	srv, err := devserver.StartRedis(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Set(ctx, "users-own", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	sz := tinySizes()
	if err := run(ctx, io.Discard, environment{redisURL: "redis://" + srv.Addr, log: io.Discard}, sz, []string{"redis"}); err != nil {
		t.Fatal(err)
	}
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0] != "users-own" {
		t.Errorf("keys left: %d (%q …), want only users-own", len(keys), keys[:min(3, len(keys))])
	}
}

func TestQueueCases(t *testing.T) {
	cs := queueCases(fullSizes())
	byName := map[string]queueCase{}
	for _, c := range cs {
		if _, dup := byName[c.name]; dup {
			t.Errorf("row %q twice", c.name)
		}
		byName[c.name] = c
	}
	limitedBase := cs[cs[len(cs)-2].base]
	tests := []struct {
		name string
		want func(queueCase) bool
	}{
		{"backlog 1M, 100 tenants", func(c queueCase) bool { return c.tasks == 1_000_000 && c.large && c.base == 0 }},
		{"backlog 100k, 100 tenants", func(c queueCase) bool { return !c.large && c.tenants == 100 }},
		{"backlog 100k, 1 tenant", func(c queueCase) bool { return c.tenants == 1 }},
		{"backlog 100k, 10k tenants", func(c queueCase) bool { return c.tenants == 10_000 }},
		{"1,000 tenants × 50, per-tenant limit 1, 0 % capped", func(c queueCase) bool {
			return c.perTenant && c.capped == 0 && !c.others && cs[c.base] == limitedBase
		}},
		{"1,000 tenants × 50, per-tenant limit 1, 50 % capped", func(c queueCase) bool { return c.capped == 500 && !c.others }},
		{"1,000 tenants × 50, per-tenant limit 1, 100 % capped: claims take the tasks of 32 other tenants, one task each", func(c queueCase) bool {
			return c.capped == 1000 && c.others && c.tasks == 50_000
		}},
		{"small queue beside 100k tasks a tenant scheduled for tomorrow (Submit: that tenant's)", func(c queueCase) bool {
			return c.scheduled == 100_000 && c.tasks == 100 && c.base == 0
		}},
	}
	for _, tt := range tests {
		c, ok := byName[tt.name]
		if !ok {
			t.Errorf("no row %q", tt.name)
			continue
		}
		if !tt.want(c) {
			t.Errorf("%s: %+v", tt.name, c)
		}
	}
	if !limitedBase.perTenant || limitedBase.tasks != 100 {
		t.Errorf("the limited rows' baseline is %+v", limitedBase)
	}
	if q := queueCases(quickSizes()); len(q) != len(cs)-1 {
		t.Errorf("quick has %d rows, want the full %d less the 1M backlog", len(q), len(cs))
	}
}

func TestPercentile(t *testing.T) {
	var l latencies
	for i := range 100 {
		l = append(l, time.Duration(100-i)*time.Millisecond)
	}
	tests := []struct {
		q    float64
		want time.Duration
	}{{0.5, 51 * time.Millisecond}, {0.99, 100 * time.Millisecond}, {0, time.Millisecond}}
	for _, tt := range tests {
		if got := l.p(tt.q); got != tt.want {
			t.Errorf("p(%v) = %v, want %v", tt.q, got, tt.want)
		}
	}
	if l[0] != 100*time.Millisecond {
		t.Error("p sorted its receiver")
	}
}

func TestCount(t *testing.T) {
	tests := []struct {
		n    int
		want string
	}{{100, "100"}, {1000, "1,000"}, {10_000, "10k"}, {100_000, "100k"}, {1_000_000, "1M"}, {10_000_000, "10M"}, {1500, "1,500"}}
	for _, tt := range tests {
		if got := count(tt.n); got != tt.want {
			t.Errorf("count(%d) = %q, want %q", tt.n, got, tt.want)
		}
	}
}

// testLog is the command's progress as test log lines.
func testLog(t *testing.T) io.Writer { return logWriter{t} }

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
