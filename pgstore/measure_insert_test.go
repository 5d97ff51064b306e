package pgstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
// clients submit 50,000 new keys of one tenant (keys shaped as the
// middleware's, see taskKey) in batches of 100 (the
// shape of `make river`'s batch row), first with the schema as it is,
// then with one part dropped at a time, in alternating rounds; it prints
// the median server CPU a task (the test server's processes, from
// /proc) and tasks/s. A part dropped for a round is built
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
	plain := func(sql string) string { return strings.Replace(sql, " CONCURRENTLY", "", 1) }
	parts := []struct{ name, drop, restore string }{
		{"schema as it is", "", ""},
		{"without the waiting-lines trigger", "ALTER TABLE idemgate_tasks DISABLE TRIGGER idemgate_tasks_waiting_insert",
			"ALTER TABLE idemgate_tasks ENABLE TRIGGER idemgate_tasks_waiting_insert"},
		// The Store names the columns' index after one statement that
		// names the missing digest's (see arbiter), and the digest's
		// again after the restore; the rows of v2's round have no digest,
		// as before v12.
		{"with v2's arbiter on the four texts (before v12)", plain(sqlCreateWideIndex) + "; DROP INDEX " + indexKeyDigest +
			"; ALTER TABLE idemgate_tasks DISABLE TRIGGER idemgate_tasks_key_digest_insert",
			plain(sqlCreateDigestIndex) + "; DROP INDEX " + indexKeyWide +
				"; ALTER TABLE idemgate_tasks ENABLE TRIGGER idemgate_tasks_key_digest_insert"},
	}
	const rounds, batches, size, clients = 8, 500, 100, 4
	cpu := map[string][]float64{}
	rate := map[string][]float64{}
	sizes := map[string]string{} // the indexes' sizes after the part's last round
	for r := range rounds {
		// Each round starts with another part, so that none always
		// follows the same one.
		for i := range parts {
			p := parts[(r+i)%len(parts)]
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
			cpu0 := serverCPUTicks(t, s)
			start := time.Now()
			var wg sync.WaitGroup
			for range clients {
				wg.Go(func() {
					for i := range next {
						ts := make([]NewTask, size)
						for j := range ts {
							ts[j] = tenantTask("bench", taskKey(fmt.Sprintf("r%d-%d-%d", r, i, j)))
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
			cpu[p.name] = append(cpu[p.name], float64(serverCPUTicks(t, s)-cpu0)*1e4/float64(batches*size))
			rate[p.name] = append(rate[p.name], float64(batches*size)/elapsed.Seconds())
			var keyKB, pkeyKB int64
			if err := s.pool.QueryRow(ctx, `SELECT coalesce(pg_relation_size(to_regclass($1)), pg_relation_size(to_regclass($2))) / 1024,
				pg_relation_size('idemgate_tasks_pkey') / 1024`, indexKeyDigest, indexKeyWide).Scan(&keyKB, &pkeyKB); err != nil {
				t.Fatal(err)
			}
			sizes[p.name] = fmt.Sprintf("key index %d kB, primary key %d kB", keyKB, pkeyKB)
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
		t.Logf("  %-50s server CPU %5.1f µs a task (%+.0f %%), %6.0f tasks/s; %s", p.name, median(cpu[p.name]),
			100*(median(cpu[p.name])/base-1), median(rate[p.name]), sizes[p.name])
	}
}

// taskKey is an idempotency key as the middleware gives Submit one
// (keyspace's Key.Task(): the kind, then the hex SHA-256 of the key),
// made from s.
func taskKey(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "image:" + hex.EncodeToString(sum[:])
}

// serverCPUTicks is the CPU time, in clock ticks, of the PostgreSQL
// server s is connected to: its postmaster's, its exited children's and
// its running children's (the backends), so that other servers on the
// machine do not count.
func serverCPUTicks(t testing.TB, s *Store) int64 {
	t.Helper()
	var backend int
	if err := s.pool.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		t.Fatal(err)
	}
	postmaster, _, ok := procStat(backend)
	if !ok {
		t.Fatalf("no /proc entry for backend %d", backend)
	}
	_, total, ok := procStat(postmaster)
	if !ok {
		t.Fatalf("no /proc entry for the postmaster %d", postmaster)
	}
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range stats {
		pid, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(path, "/proc/"), "/stat"))
		if err != nil {
			continue
		}
		if ppid, ticks, ok := procStat(pid); ok && ppid == postmaster {
			total += ticks
		}
	}
	return total
}

// procStat reads process pid's parent and CPU ticks (user and system,
// with those of its exited children for the postmaster's sake).
func procStat(pid int) (ppid int, ticks int64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false // the process ended
	}
	line := string(b)
	end := strings.LastIndex(line, ")")
	if end < 0 {
		return 0, 0, false
	}
	f := strings.Fields(line[end+2:])
	if len(f) < 15 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	for _, v := range f[11:15] {
		n, _ := strconv.ParseInt(v, 10, 64)
		ticks += n
	}
	return ppid, ticks, true
}
