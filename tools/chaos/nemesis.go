package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	"commit-kill",   // slow the API nodes' Postgres links, SIGKILL the node whose export commits its ledger row first
	"ack-kill",      // slow one API node's Postgres link, SIGKILL it right after a client got a 2xx to a POST from it
	"export-pause",  // SIGSTOP the API node an export was just sent to, for one to three leases, while it renders
	"cancel-slow",   // slow both workers' Postgres links around a cancel sent near the end of a generation
}

// aimWait bounds how long an export-pause or a cancel-slow waits for
// what it aims at.
const aimWait = 4 * time.Second

// ackKillWait bounds how long an ack-kill waits for a 2xx from its node.
const ackKillWait = 6 * time.Second

// commitKillWait bounds how long a commit-kill waits for an export to
// commit on its node before it heals without a kill.
const commitKillWait = 6 * time.Second

// nemesis injects faults on a seeded schedule until stop.
type nemesis struct {
	sys   *system
	rec   *recorder
	rng   *rand.Rand
	kinds []string // allowed kinds
	deck  []string // kinds left in this round
	log   func(format string, args ...any)
	flush *redis.Client // nil when there is no Redis (-store postgres)
	pg    *pgx.Conn     // direct (unproxied) connection that watches the export ledger
	plan  plan          // the run's modes: how long the longer faults last
	acks  *acks         // the 2xx answers clients get, for ack-kill
	aims  *aims         // exports sent and cancels to come, for export-pause and cancel-slow
}

// close releases the nemesis's own connection.
func (n *nemesis) close() {
	if n.pg != nil {
		n.pg.Close(context.Background())
	}
}

// parseKinds checks a comma-separated list of fault kinds ("" or "all":
// every kind that applies to the store). With the records in Postgres the
// example uses no Redis, so the kinds that break Redis do not apply.
func parseKinds(s, store string) ([]string, error) {
	applies := func(k string) bool { return store != "postgres" || !redisKinds[k] }
	if s == "" || s == "all" {
		var out []string
		for _, k := range faultKinds {
			if applies(k) {
				out = append(out, k)
			}
		}
		return out, nil
	}
	if s == "none" {
		return nil, nil
	}
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if !slices.Contains(faultKinds, k) {
			return nil, fmt.Errorf("chaos: unknown fault kind %q (kinds: %s)", k, strings.Join(faultKinds, ", "))
		}
		if !applies(k) {
			return nil, fmt.Errorf("chaos: fault kind %q needs Redis, which -store %s does not use", k, store)
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

// minFault is the shortest window a fault is given.
const minFault = 300 * time.Millisecond

// run injects one fault after another, each healed before the next, until
// until; then it heals everything. The caller reads the heal time when run
// returns: see deal.
func (n *nemesis) run(ctx context.Context, until time.Time) {
	defer n.healAll(ctx)
	if len(n.kinds) == 0 {
		sleep(ctx, time.Until(until))
		return
	}
	n.deal(ctx, until, n.inject)
}

// overdueWindow is the window of a kind of the first round dealt after
// until.
const overdueWindow = time.Second

// deal calls inject with one kind after another, a short random gap
// between them, until until. The first round is always dealt in full, so
// that a short run meets every kind: inject gives each fault its share of
// the time left over the kinds left in the round, and a kind the window
// did not reach (on a loaded machine a restart takes seconds) is dealt
// after until, overdue, with a window of overdueWindow.
func (n *nemesis) deal(ctx context.Context, until time.Time, inject func(ctx context.Context, kind string, until time.Time)) {
	for dealt := 0; ctx.Err() == nil; dealt++ {
		if time.Now().Before(until) {
			sleep(ctx, min(n.dur(200*time.Millisecond, time.Second), time.Until(until)))
		}
		switch {
		case time.Until(until) >= minFault: // inject skips a shorter window
			inject(ctx, n.pick(), until)
		case dealt < len(n.kinds):
			kind := n.pick()
			n.log("fault %s overdue: the window closed before the first round was dealt", kind)
			inject(ctx, kind, time.Now().Add(overdueWindow))
		default:
			return
		}
	}
}

// inject runs one fault to its end. Durations never reach past until, nor
// past the fault's share of the round: what is left until until over the
// kinds left in the round, this one included, but never under minFault.
// deal alone decides whether a fault has time: on a loaded machine the
// window can shrink under minFault between its look and this one, and a
// fault dealt and then dropped is a kind the first round never met.
func (n *nemesis) inject(ctx context.Context, kind string, until time.Time) {
	left := max(time.Until(until)/time.Duration(len(n.deck)+1), minFault)
	capped := func(d time.Duration) time.Duration { return min(d, left) }
	stopBy := time.Now().Add(left)
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
		d := capped(n.dur(300*time.Millisecond, n.plan.longest()))
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
	case "commit-kill":
		// Both API nodes' Postgres links are slowed (one alone would
		// drive the clients to the other), so that a commit's reply and
		// whatever a node writes after it reach their ends well after
		// the commit shows in the ledger: the kill lands in between.
		nodes := n.sys.api()
		delay := n.dur(15*time.Millisecond, 40*time.Millisecond)
		wait := capped(n.dur(2*time.Second, commitKillWait))
		for _, p := range nodes {
			p.links["pg"].Set(proxy.Delay, delay)
		}
		p, id, err := n.killOnCommit(ctx, nodes, time.Now().Add(wait))
		healed := time.Now()
		for _, q := range nodes {
			q.links["pg"].Heal()
		}
		slow := fmt.Sprintf("→pg +%v per chunk", delay.Round(time.Millisecond))
		switch {
		case p != nil:
			f.Detail = fmt.Sprintf("%s%s: killed once export %d committed", p.name, slow, id)
		case err != nil:
			p, f.Detail = nodes[0], fmt.Sprintf("%s%s: no kill: %v", nodes[0].name, slow, err)
		default:
			p, f.Detail = nodes[0], fmt.Sprintf("%s%s: no export committed within %v", nodes[0].name, slow, wait.Round(time.Millisecond))
		}
		f.Target = p.name
		// Every slowed link is on the record, so that the checker
		// knows what each node went through.
		for _, q := range nodes {
			if q != p {
				n.rec.fault(Fault{Kind: "latency", Target: q.name, Start: f.Start, End: healed,
					Detail: q.name + slow + " during a commit-kill"})
			}
		}
		if id != 0 {
			sleep(ctx, capped(n.dur(200*time.Millisecond, 1500*time.Millisecond)))
			if err := p.start(n.sys.bin); err != nil {
				n.log("restart %s: %v", p.name, err)
			}
		}
	case "ack-kill":
		// The node's Postgres link is slow, so that what it writes after
		// an answer (a completion, a COMMIT that should have come first)
		// is still on its way when the client has its 2xx: the kill
		// lands between the answer and whatever was not done before it.
		p := n.sys.api()[n.rng.IntN(2)]
		delay := n.dur(15*time.Millisecond, 60*time.Millisecond)
		f.Target = p.name
		p.links["pg"].Set(proxy.Delay, delay)
		got := n.acks.next(ctx, p.addr, time.Now().Add(capped(ackKillWait)))
		if got != "" {
			p.kill()
		}
		p.links["pg"].Heal()
		if got == "" {
			f.Detail = fmt.Sprintf("%s→pg +%v per chunk: no 2xx within %v", p.name, delay.Round(time.Millisecond), ackKillWait)
			break
		}
		f.Detail = fmt.Sprintf("%s→pg +%v per chunk: killed right after %s", p.name, delay.Round(time.Millisecond), got)
		sleep(ctx, capped(n.dur(200*time.Millisecond, 1500*time.Millisecond)))
		if err := p.start(n.sys.bin); err != nil {
			n.log("restart %s: %v", p.name, err)
		}
	case "export-pause":
		// The node that holds an export's claim stops past its lease
		// while it renders: a retry on the other node takes the key
		// over, then the node wakes and finishes its run. Its commit or
		// completion must be refused (its lease is gone), and the
		// client must see one answer.
		node := n.aims.nextExport(ctx, time.Now().Add(capped(aimWait)))
		var p *proc
		for _, q := range n.sys.api() {
			if q.addr == node {
				p = q
			}
		}
		if p == nil {
			f.Target = n.sys.api()[0].name
			f.Detail = fmt.Sprintf("no export sent within %v", aimWait)
			break
		}
		// Let the claim be taken and the render begin.
		sleep(ctx, min(max(n.plan.exportTime, 300*time.Millisecond)/3, time.Until(stopBy)))
		lo, hi := 300*time.Millisecond, n.plan.longest()
		if n.plan.lease > 0 {
			lo = n.plan.lease
		}
		d := min(n.dur(lo, hi), time.Until(stopBy))
		f.Target = p.name
		f.Detail = fmt.Sprintf("%s stopped for %v while an export renders", p.name, d.Round(time.Millisecond))
		p.signal(sigStop)
		sleep(ctx, d)
		p.signal(sigCont)
	case "cancel-slow":
		// A client cancels a running task near the end of its
		// generation; both workers' Postgres links are slow from just
		// before until after, so that an attempt whose generator has
		// returned is still writing its outcome when the cancel lands.
		// The finish must keep the cancel.
		workers := n.sys.procs[2:]
		at := n.aims.nextCancel(ctx, time.Now().Add(capped(aimWait)))
		f.Target = workers[0].name
		if at.IsZero() {
			f.Detail = fmt.Sprintf("no cancel near a generation's end within %v", aimWait)
			break
		}
		sleep(ctx, time.Until(at.Add(-600*time.Millisecond)))
		f.Start = time.Now()
		delay := n.dur(60*time.Millisecond, 200*time.Millisecond)
		for _, p := range workers {
			p.links["pg"].Set(proxy.Delay, delay)
		}
		sleep(ctx, min(time.Until(at.Add(1500*time.Millisecond)), time.Until(stopBy)))
		for _, p := range workers {
			p.links["pg"].Heal()
		}
		slow := fmt.Sprintf("→pg +%v per chunk around a cancel at %s", delay.Round(time.Millisecond), at.Format(timeFmt))
		f.Detail = workers[0].name + slow
		for _, q := range workers[1:] {
			n.rec.fault(Fault{Kind: "latency", Target: q.name, Start: f.Start, End: time.Now(),
				Detail: q.name + slow + " during a cancel-slow"})
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
		d := capped(n.dur(300*time.Millisecond, n.plan.longest()))
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

// lastExport returns the newest ledger row's id, 0 before the first
// export (the route makes the ledger then).
func lastExport(ctx context.Context, conn *pgx.Conn) (int64, error) {
	var found bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('idemgate_example_exports') IS NOT NULL`).Scan(&found); err != nil || !found {
		return 0, err
	}
	var last int64
	err := conn.QueryRow(ctx, `SELECT COALESCE(max(id), 0) FROM idemgate_example_exports`).Scan(&last)
	return last, err
}

// killOnCommit watches the export ledger from a connection of its own and
// SIGKILLs the node that wrote the first row to commit, and returns it
// and the row's id; nil when none commits before until.
func (n *nemesis) killOnCommit(ctx context.Context, nodes []*proc, until time.Time) (*proc, int64, error) {
	if n.pg == nil || n.pg.IsClosed() {
		conn, err := pgx.Connect(ctx, n.sys.pg.DSN("postgres"))
		if err != nil {
			return nil, 0, err
		}
		n.pg = conn
	}
	last, err := lastExport(ctx, n.pg)
	if err != nil {
		// The connection may have died with a Postgres restart: once more.
		n.pg.Close(ctx)
		if n.pg, err = pgx.Connect(ctx, n.sys.pg.DSN("postgres")); err != nil {
			return nil, 0, err
		}
		if last, err = lastExport(ctx, n.pg); err != nil {
			n.pg.Close(ctx)
			return nil, 0, err
		}
	}
	byAddr := map[string]*proc{}
	for _, p := range nodes {
		byAddr[p.addr] = p
	}
	for time.Now().Before(until) && ctx.Err() == nil {
		var (
			id   int64
			node string
		)
		err := n.pg.QueryRow(ctx, `SELECT id, node FROM idemgate_example_exports WHERE id > $1 ORDER BY id LIMIT 1`, last).Scan(&id, &node)
		switch {
		case err == nil:
			if p := byAddr[node]; p != nil {
				p.kill()
				return p, id, nil
			}
			last = id
		case errors.Is(err, pgx.ErrNoRows):
		default:
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "42P01" { // the ledger is made by the first export
				n.pg.Close(ctx)
				return nil, 0, err
			}
		}
		sleep(ctx, 2*time.Millisecond)
	}
	return nil, 0, nil
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
	if n.sys.redis == nil {
		return
	}
	select {
	case <-n.sys.redis.Exited():
		if err := n.sys.redis.Restart(ctx); err != nil {
			n.log("restart redis: %v", err)
		}
	default:
	}
}
