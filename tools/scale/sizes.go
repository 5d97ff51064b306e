package main

import (
	"fmt"
	"slices"
	"time"
)

// sizes are the queues and tables a run builds.
type sizes struct {
	// Samples is how many claims, Submits and replays each row times.
	Samples int
	// Small is the baseline queue: Small tasks of SmallTenants tenants.
	Small, SmallTenants int
	// Backlogs are the queues of BacklogTenants tenants measured against
	// the baseline; the last one is "large" (a 2× target).
	Backlogs       []int
	BacklogTenants int
	// Tenants are the tenant counts of a backlog of TenantsBacklog.
	Tenants        []int
	TenantsBacklog int
	// CappedTenants each have CappedEach waiting tasks under a
	// per-tenant limit of one; Capped are the percentages of them
	// running one attempt already.
	CappedTenants, CappedEach int
	Capped                    []int
	// Scheduled is the tasks one tenant schedules for tomorrow beside
	// the baseline queue.
	Scheduled int
	// Records are the pgrecords table sizes; the first is the baseline,
	// the last is large and is swept: Expired of its records are
	// expired, spread through it.
	Records []int
	Expired int
	// RedisRecords are the Redis keyspace sizes; the first is the
	// baseline, the last is large.
	RedisRecords []int
}

func fullSizes() sizes {
	return sizes{
		Samples: 300, Small: 100, SmallTenants: 10,
		Backlogs: []int{10_000, 100_000, 1_000_000}, BacklogTenants: 100,
		Tenants: []int{1, 100, 10_000}, TenantsBacklog: 100_000,
		CappedTenants: 1000, CappedEach: 50, Capped: []int{0, 50, 100},
		Scheduled: 100_000,
		Records:   []int{10_000, 10_000_000}, Expired: 100_000,
		RedisRecords: []int{10_000, 10_000_000},
	}
}

func quickSizes() sizes {
	s := fullSizes()
	s.Samples = 100
	s.Backlogs = []int{10_000, 100_000}
	s.Records = []int{10_000, 1_000_000}
	s.RedisRecords = []int{10_000, 1_000_000}
	return s
}

// tinySizes build every row in seconds, for the command's own test.
func tinySizes() sizes {
	return sizes{
		Samples: 5, Small: 20, SmallTenants: 4,
		Backlogs: []int{200}, BacklogTenants: 10,
		Tenants: []int{1}, TenantsBacklog: 200,
		CappedTenants: 8, CappedEach: 5, Capped: []int{0, 50, 100},
		Scheduled: 300,
		Records:   []int{100, 1000}, Expired: 50,
		RedisRecords: []int{100, 1000},
	}
}

// warmup is how many calls go untimed before samples timed ones: a
// fresh pool's first calls open connections and prepare statements.
func warmup(samples int) int { return max(3, samples/10) }

// latencies are the times of one kind of call.
type latencies []time.Duration

// p returns the q-quantile (0 < q < 1) by nearest rank.
func (l latencies) p(q float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*q))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// verdict says whether r is within target.
func verdict(r, target float64) string {
	if r <= target {
		return fmt.Sprintf("≤ %.1f× met", target)
	}
	return fmt.Sprintf("**≤ %.1f× missed**", target)
}
