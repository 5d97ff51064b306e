package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Modes a run can be in besides its faults. Like the fault kinds they are
// dealt by the seed ("-modes random"), so runs at many seeds meet them all,
// and a run prints the modes it drew.
var modeNames = []string{
	// short-lease: the middleware's and the workers' leases are 1-2 s,
	// generations and exports take longer than a lease (so renewal and
	// fencing carry every task), and pauses, freezes and partitions last
	// up to three leases (so leases run out under live holders).
	"short-lease",
	// limits: the images kind gets MaxRunning / MaxRunningPerTenant limits
	// that change during the run, and is paused and resumed.
	"limits",
	// flood: one more tenant submits bursts of tasks, far more than the
	// workers can start at once, while the others go on as before.
	"flood",
}

// floodTenant is the tenant of the flooding client.
const floodTenant = "floodco"

// plan is what a run does besides its faults: the modes and the timings
// they imply.
type plan struct {
	modes      []string
	lease      time.Duration // both leases; 0: the defaults (30 s)
	genTime    time.Duration // the stand-in generator's time
	exportTime time.Duration // the stand-in renderer's time; 0: the example's 300 ms
}

func (p plan) has(mode string) bool { return slices.Contains(p.modes, mode) }

// longest is how long a pause, freeze, drop or partition may last: 3 s,
// or in short-lease mode three leases, so that the longer ones outlast a
// lease under a live holder.
func (p plan) longest() time.Duration {
	if p.lease == 0 {
		return 3 * time.Second
	}
	return 3 * p.lease
}

// makePlan reads -modes ("random", "none" or a comma list) and deals the
// random ones from the seed; genTime is -gen-time, kept unless short-lease
// mode stretches it past a lease.
func makePlan(modes string, seed int64, genTime time.Duration) (plan, error) {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x6d6f6465))
	p := plan{genTime: genTime}
	switch modes {
	case "", "random":
		for _, m := range modeNames {
			if rng.IntN(2) == 0 {
				p.modes = append(p.modes, m)
			}
		}
	case "none":
	case "all":
		p.modes = append(p.modes, modeNames...)
	default:
		for _, m := range strings.Split(modes, ",") {
			m = strings.TrimSpace(m)
			if !slices.Contains(modeNames, m) {
				return p, fmt.Errorf("chaos: unknown mode %q (modes: %s, or random, all, none)", m, strings.Join(modeNames, ", "))
			}
			if !p.has(m) {
				p.modes = append(p.modes, m)
			}
		}
	}
	if p.has("short-lease") {
		p.lease = time.Second + time.Duration(rng.Int64N(int64(time.Second)))
		// Slow handlers: a generation and an export take 1.2-1.8 leases,
		// so each lives on renewals and a retry waits through one.
		p.genTime = time.Duration(float64(p.lease) * (1.2 + 0.6*rng.Float64()))
		p.exportTime = time.Duration(float64(p.lease) * (1.2 + 0.6*rng.Float64()))
	}
	return p, nil
}

// String names the plan for the report's first line.
func (p plan) String() string {
	if len(p.modes) == 0 {
		return "modes none"
	}
	s := "modes " + strings.Join(p.modes, ",")
	if p.lease > 0 {
		s += fmt.Sprintf(" (leases %v, generation %v, export %v)", p.lease.Round(time.Millisecond),
			p.genTime.Round(time.Millisecond), p.exportTime.Round(time.Millisecond))
	}
	return s
}
