package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/internal/proxy"
)

// Fault kinds the nemesis injects. No clock games: the machine is shared.
var faultKinds = []string{
	"kill",          // SIGKILL a process, start it again after a pause
	"pause",         // SIGSTOP a process, SIGCONT it later
	"redis-restart", // kill redis-server (its data is gone), start it again
	"flushall",      // FLUSHALL on Redis
	"pg-restart",    // restart Postgres (fast shutdown)
	"partition",     // cut one process's link to Redis or Postgres
	"freeze",        // hold every byte on one link
	"drop",          // blackhole one link
	"latency",       // delay every chunk on one link
}

// nemesis injects faults on a seeded schedule until stop.
type nemesis struct {
	sys   *system
	rec   *recorder
	rng   *rand.Rand
	kinds []string // allowed kinds
	deck  []string // kinds left in this round
	log   func(format string, args ...any)
	flush *redis.Client
}

// parseKinds checks a comma-separated list of fault kinds ("" or "all": every kind).
func parseKinds(s string) ([]string, error) {
	if s == "" || s == "all" {
		return faultKinds, nil
	}
	if s == "none" {
		return nil, nil
	}
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		found := false
		for _, f := range faultKinds {
			found = found || f == k
		}
		if !found {
			return nil, fmt.Errorf("chaos: unknown fault kind %q (kinds: %s)", k, strings.Join(faultKinds, ", "))
		}
		out = append(out, k)
	}
	return out, nil
}

// pick returns the next fault kind: the allowed kinds are dealt in rounds,
// each round a seeded shuffle, so that a short run still meets every kind.
func (n *nemesis) pick() string {
	if len(n.deck) == 0 {
		n.deck = append(n.deck, n.kinds...)
		n.rng.Shuffle(len(n.deck), func(i, j int) { n.deck[i], n.deck[j] = n.deck[j], n.deck[i] })
	}
	k := n.deck[0]
	n.deck = n.deck[1:]
	return k
}

// dur returns a random duration in [lo, hi).
func (n *nemesis) dur(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(n.rng.Int64N(int64(hi-lo)))
}

// run injects one fault after another, each healed before the next, until
// until; then it heals everything.
func (n *nemesis) run(ctx context.Context, until time.Time) {
	defer n.healAll(ctx)
	if len(n.kinds) == 0 {
		sleep(ctx, time.Until(until))
		return
	}
	for ctx.Err() == nil {
		sleep(ctx, n.dur(200*time.Millisecond, time.Second))
		if !time.Now().Before(until) {
			return
		}
		n.inject(ctx, n.pick(), until)
	}
}

// inject runs one fault to its end. Durations never reach past until.
func (n *nemesis) inject(ctx context.Context, kind string, until time.Time) {
	left := time.Until(until)
	if left < 300*time.Millisecond {
		return
	}
	capped := func(d time.Duration) time.Duration { return min(d, left) }
	f := Fault{Kind: kind, Start: time.Now()}
	switch kind {
	case "kill":
		p := n.sys.procs[n.rng.IntN(len(n.sys.procs))]
		f.Target = p.name
		p.kill()
		sleep(ctx, capped(n.dur(200*time.Millisecond, 1500*time.Millisecond)))
		if err := p.start(n.sys.bin); err != nil {
			n.log("restart %s: %v", p.name, err)
		}
	case "pause":
		p := n.sys.procs[n.rng.IntN(len(n.sys.procs))]
		f.Target = p.name
		d := capped(n.dur(300*time.Millisecond, 3*time.Second))
		f.Detail = d.Round(time.Millisecond).String()
		p.signal(sigStop)
		sleep(ctx, d)
		p.signal(sigCont)
	case "redis-restart":
		_ = n.sys.redis.Kill()
		sleep(ctx, capped(n.dur(100*time.Millisecond, 1500*time.Millisecond)))
		if err := n.sys.redis.Restart(ctx); err != nil {
			n.log("restart redis: %v", err)
		}
	case "flushall":
		if err := n.flush.FlushAll(ctx).Err(); err != nil {
			f.Detail = "failed: " + err.Error()
		}
	case "pg-restart":
		if err := n.sys.pg.Restart(ctx); err != nil {
			n.log("restart postgres: %v", err)
		}
	case "partition", "freeze", "drop", "latency":
		p := n.sys.procs[n.rng.IntN(len(n.sys.procs))]
		names := make([]string, 0, len(p.links))
		for name := range p.links {
			names = append(names, name)
		}
		sort.Strings(names)
		link := names[n.rng.IntN(len(names))]
		mode, delay := map[string]proxy.Mode{"partition": proxy.Cut, "freeze": proxy.Freeze, "drop": proxy.Drop, "latency": proxy.Delay}[kind], time.Duration(0)
		d := capped(n.dur(300*time.Millisecond, 3*time.Second))
		if kind == "latency" {
			delay = n.dur(20*time.Millisecond, 400*time.Millisecond)
			d = capped(n.dur(time.Second, 4*time.Second))
		}
		f.Target = p.name
		f.Detail = fmt.Sprintf("%s→%s for %v", p.name, link, d.Round(time.Millisecond))
		if delay > 0 {
			f.Detail += fmt.Sprintf(" (+%v per chunk)", delay.Round(time.Millisecond))
		}
		p.links[link].Set(mode, delay)
		sleep(ctx, d)
		p.links[link].Heal()
	}
	f.End = time.Now()
	n.rec.fault(f)
}

// healAll undoes whatever may be left: every link passes, every process
// runs and is not stopped.
func (n *nemesis) healAll(ctx context.Context) {
	for _, p := range n.sys.procs {
		for _, l := range p.links {
			l.Heal()
		}
		if !p.running() {
			if err := p.start(n.sys.bin); err != nil {
				n.log("restart %s: %v", p.name, err)
			}
		}
		p.signal(sigCont)
	}
	select {
	case <-n.sys.redis.Exited():
		if err := n.sys.redis.Restart(ctx); err != nil {
			n.log("restart redis: %v", err)
		}
	default:
	}
}
