package pgstore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// What each index and the waiting-lines trigger cost SubmitMany: 4
// clients submit 50,000 new keys of one tenant in batches of 100 (the
// shape of `make river`'s batch row), first with the schema as it is,
// then with one part dropped at a time, in alternating rounds; it prints
// the median server CPU a task (every postgres process of the throwaway
// cluster, from /proc) and tasks/s. A part dropped for a round is built
// again before the next.
//
//	PGSTORE_MEASURE=1 go test -count=1 -v -run TestMeasureSubmitManyParts ./pgstore/
func TestMeasureSubmitManyParts(t *testing.T) {
	measuring(t)
	s, _ := setup(t)
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		if _, err := s.pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	parts := []struct{ name, drop, restore string }{
		{"schema as it is", "", ""},
		{"without the waiting-lines trigger", "ALTER TABLE idemgate_tasks DISABLE TRIGGER idemgate_tasks_waiting_insert",
			"ALTER TABLE idemgate_tasks ENABLE TRIGGER idemgate_tasks_waiting_insert"},
		{"with v8's runnable index again (before v10)", strings.Replace(sqlCreateRunnableIndexV8, " CONCURRENTLY", "", 1),
			"DROP INDEX " + indexRunnableV8},
	}
	const rounds, batches, size, clients = 5, 500, 100, 4
	cpu := map[string][]float64{}
	rate := map[string][]float64{}
	for r := range rounds {
		for _, p := range parts {
			if p.drop != "" {
				exec(p.drop)
			}
			exec("TRUNCATE idemgate_tasks")
			exec("TRUNCATE idemgate_waiting_tenants")
			next := make(chan int, batches)
			for i := range batches {
				next <- i
			}
			close(next)
			cpu0 := postgresCPUTicks(t)
			start := time.Now()
			var wg sync.WaitGroup
			for range clients {
				wg.Go(func() {
					for i := range next {
						ts := make([]NewTask, size)
						for j := range ts {
							ts[j] = tenantTask("bench", fmt.Sprintf("r%d-%d-%d", r, i, j))
						}
						if _, err := s.SubmitMany(ctx, ts); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			// A tick is 10 ms of CPU.
			cpu[p.name] = append(cpu[p.name], float64(postgresCPUTicks(t)-cpu0)*1e4/float64(batches*size))
			rate[p.name] = append(rate[p.name], float64(batches*size)/elapsed.Seconds())
			if p.restore != "" {
				exec(p.restore)
			}
		}
	}
	median := func(xs []float64) float64 {
		xs = slices.Clone(xs)
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("SubmitMany of %d × %d new keys, %d clients, median of %d rounds (load %s):", batches, size, clients, rounds,
		strings.Join(strings.Fields(string(load))[:3], " "))
	base := median(cpu[parts[0].name])
	for _, p := range parts {
		t.Logf("  %-60s server CPU %5.1f µs a task (%+.0f %%), %6.0f tasks/s", p.name, median(cpu[p.name]),
			100*(median(cpu[p.name])/base-1), median(rate[p.name]))
	}
}

// postgresCPUTicks is the CPU time, in clock ticks, of every process
// named postgres on this machine: the throwaway cluster of the tests (and
// any other cluster running here, which makes the figure noisier).
func postgresCPUTicks(t testing.TB) int64 {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // the process ended
		}
		line := string(b)
		end := strings.LastIndex(line, ")")
		if end < 0 || !strings.Contains(line[:end], "(postgres") {
			continue
		}
		fields := strings.Fields(line[end+2:])
		user, _ := strconv.ParseInt(fields[11], 10, 64)
		sys, _ := strconv.ParseInt(fields[12], 10, 64)
		total += user + sys
	}
	return total
}
