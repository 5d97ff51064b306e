package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemgate/idemgate/internal/devserver"
	"github.com/idemgate/idemgate/internal/proxy"
)

// system is the service under test: one Postgres, one redis-server, two
// API nodes and two worker processes of the example, each link from a
// process to a server going through a proxy of its own.
type system struct {
	dir    string // run directory: binary, logs, history
	bin    string // the example binary
	secret string // JWT secret shared with the clients
	env    []string

	pg    *devserver.Postgres
	redis *devserver.Redis
	procs []*proc // api0, api1, worker0, worker1

	log func(format string, args ...any)
}

// procKind tells API nodes from worker processes.
type procKind int

const (
	apiNode procKind = iota
	workerProc
)

// proc is one example process; it can be killed and started again.
type proc struct {
	name  string
	kind  procKind
	addr  string // API nodes: listen address
	args  []string
	env   []string
	logf  string
	links map[string]*proxy.Proxy // "redis", "pg" → the proxy of this process's link

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	paused bool
	// held is set by kill and cleared by start: the nemesis keeps the
	// process down, and supervise leaves it alone.
	held bool
}

// url is the base URL of an API node.
func (p *proc) url() string { return "http://" + p.addr }

// systemConfig says how to build and run the system.
type systemConfig struct {
	root    string // module root
	plant   string // a planted bug, or ""
	store   string // where the API nodes keep idempotency records: "redis" or "postgres"
	policy  string // the workers' TASK_POLICY: kind=uncertain|retry,...
	genTime time.Duration
	// lease is both leases (IDEM_LEASE, TASK_LEASE) and exportTime the
	// renderer's time (EXPORT_TIME); zero: the example's defaults.
	lease, exportTime time.Duration
	workers           int // tasks per worker process
	log               func(format string, args ...any)
}

// buildBound bounds building the example: minutes from a cold directory
// on a loaded machine.
const buildBound = 20 * time.Minute

// startSystem builds the example and starts everything. On error, what
// was started is stopped.
func startSystem(ctx context.Context, cfg systemConfig) (s *system, err error) {
	dir, err := os.MkdirTemp("", "idemgate-chaos-")
	if err != nil {
		return nil, fmt.Errorf("chaos: run dir: %w", err)
	}
	s = &system{dir: dir, log: cfg.log}
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	var b [16]byte
	_, _ = rand.Read(b[:])
	s.secret = hex.EncodeToString(b[:])

	bctx, cancel := context.WithTimeout(ctx, buildBound)
	s.bin, err = buildExample(bctx, cfg.root, cfg.plant != "")
	cancel()
	if err != nil {
		return s, err
	}
	s.log("built the example%s", map[bool]string{true: " with the plant " + cfg.plant, false: ""}[cfg.plant != ""])

	if s.pg, err = devserver.StartPostgres(ctx); err != nil {
		return s, err
	}
	// With the records in Postgres the example uses no Redis at all.
	if cfg.store != "postgres" {
		if s.redis, err = devserver.StartRedis(ctx, 0); err != nil {
			return s, err
		}
		s.log("postgres on %s, redis on %s, run dir %s", s.pg.Addr, s.redis.Addr, dir)
	} else {
		s.log("postgres on %s (records too: STORE=postgres), run dir %s", s.pg.Addr, dir)
	}

	s.env = []string{
		"JWT_SECRET=" + s.secret,
		"GEN_TIME=" + cfg.genTime.String(),
		plantEnv + "=" + cfg.plant,
		// The example's per-tenant limits would answer the soak's
		// clients 429 before any handler: the soak tests the
		// middleware and the queue, not a limit on its own load.
		"EXPORTS_PER_MINUTE=0",
		"SUBMITS_PER_MINUTE=0",
	}
	if cfg.lease > 0 {
		s.env = append(s.env, "IDEM_LEASE="+cfg.lease.String(), "TASK_LEASE="+cfg.lease.String())
	}
	if cfg.exportTime > 0 {
		s.env = append(s.env, "EXPORT_TIME="+cfg.exportTime.String())
	}
	for i := range 2 {
		port, err := devserver.FreePort()
		if err != nil {
			return s, err
		}
		p := &proc{name: fmt.Sprintf("api%d", i), kind: apiNode, addr: fmt.Sprintf("127.0.0.1:%d", port),
			args: []string{"serve", "-workers", "0"}}
		s.procs = append(s.procs, p)
	}
	for i := range 2 {
		p := &proc{name: fmt.Sprintf("worker%d", i), kind: workerProc,
			args: []string{"worker", "-workers", fmt.Sprint(cfg.workers)}}
		s.procs = append(s.procs, p)
	}
	for _, p := range s.procs {
		p.logf = filepath.Join(dir, p.name+".log")
		p.links = map[string]*proxy.Proxy{}
		pgp, err := proxy.Start(s.pg.Addr)
		if err != nil {
			return s, err
		}
		p.links["pg"] = pgp
		// connect_timeout bounds a connect across a dropped or frozen
		// link. It was 3 s, which a loaded machine outran with no fault
		// at all: a pool whose every new connection timed out answered
		// every claim 503 for the whole run.
		p.env = append(append([]string{}, s.env...),
			"DATABASE_URL=postgres://postgres@"+pgp.Addr+"/postgres?sslmode=disable&connect_timeout=10")
		switch {
		case p.kind == workerProc:
			// The worker's name goes into the upstream's call log, so
			// that a generator call names its process; the policy says
			// what a lost attempt becomes.
			p.env = append(p.env, "WORKER_NAME="+p.name, "TASK_POLICY="+cfg.policy)
		case cfg.store == "postgres":
			p.env = append(p.env, "STORE=postgres", "ADDR="+p.addr)
		default:
			rp, err := proxy.Start(s.redis.Addr)
			if err != nil {
				return s, err
			}
			p.links["redis"] = rp
			p.env = append(p.env, "STORE=redis", "REDIS_URL=redis://"+rp.Addr+"/0", "ADDR="+p.addr)
		}
	}
	// One process migrates first, so the others find the schema ready.
	if err := s.procs[0].start(s.bin); err != nil {
		return s, err
	}
	if err := s.ready(ctx, s.procs[0]); err != nil {
		return s, err
	}
	for _, p := range s.procs[1:] {
		if err := p.start(s.bin); err != nil {
			return s, err
		}
	}
	for _, p := range s.procs {
		if err := s.ready(ctx, p); err != nil {
			return s, err
		}
	}
	return s, nil
}

// startAttempts bounds how often a process that exits before it is ready
// is run: on a loaded machine the example's first connection can time out
// (connect_timeout on every link), which is no fault of the run's.
const startAttempts = 3

// ready waits until the started process p is ready, starting it again if
// it exits first, at most startAttempts runs in all.
func (s *system) ready(ctx context.Context, p *proc) error {
	err := s.waitReady(ctx, p, 60*time.Second)
	for run := 1; errors.Is(err, errExited) && run < startAttempts; run++ {
		// Its log keeps the failed run, and start marks the new one.
		if err := p.start(s.bin); err != nil {
			return err
		}
		err = s.waitReady(ctx, p, 60*time.Second)
	}
	return err
}

// superviseEvery is how often supervise looks for a process that exited.
const superviseEvery = time.Second

// supervise looks at the processes every every until ctx ends, and starts
// again each one that exited on its own, as a service manager restarts a
// service that crashed; a process the nemesis killed is the nemesis's to
// start. Without it, a process whose start failed stayed down to the end
// of the run: on a loaded machine a restarted API node's first connection
// outlasted connect_timeout, the node exited, and its clients met
// "connection refused" until the liveness bound ran out (both soaks of a
// CI run, 2026-12-05). Each restart is logged with logf.
func (s *system) supervise(ctx context.Context, every time.Duration, logf func(string, ...any)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, p := range s.procs {
			switch did, err := p.restartIfExited(s.bin); {
			case err != nil:
				logf("restart %s: %v", p.name, err)
			case did:
				logf("%s exited on its own; started it again", p.name)
			}
		}
	}
}

// errExited is waitReady's error for a process that exited before it was
// ready.
var errExited = errors.New("exited before it was ready")

// workerPolicy returns the policy the workers say they run (a startup
// line "policy: kind=…,…"), checked against asked. An example that does
// not say is taken to run its own default, so asking for another policy
// from it is an error: the checker would judge by a policy nobody ran.
func (s *system) workerPolicy(asked map[string]string) (map[string]string, error) {
	var said map[string]string
	for _, p := range s.procs {
		if p.kind != workerProc {
			continue
		}
		got, found, err := policyLine(p.logf)
		if err != nil {
			return nil, fmt.Errorf("chaos: policy of %s: %w", p.name, err)
		}
		if !found {
			def, _ := parsePolicy(defaultPolicy)
			if !samePolicy(asked, def) {
				return nil, fmt.Errorf("chaos: -policy %s: %s does not say it runs it (the example must read TASK_POLICY and print \"policy: kind=…\" at start); without it only %s can be checked",
					formatPolicy(asked), p.name, defaultPolicy)
			}
			got = asked
		}
		for kind, pol := range asked {
			if got[kind] != pol {
				return nil, fmt.Errorf("chaos: -policy %s: %s runs %s", formatPolicy(asked), p.name, formatPolicy(got))
			}
		}
		said = got
	}
	return said, nil
}

// policyLine finds the worker's "policy: kind=…,…" startup line in its log.
func policyLine(path string) (map[string]string, bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, false, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "policy: "); ok {
			m, err := parsePolicy(rest)
			return m, err == nil, err
		}
	}
	return nil, false, nil
}

func samePolicy(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func formatPolicy(m map[string]string) string {
	parts := make([]string, 0, len(m))
	for _, k := range sortedKeys(m) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}

// builds are the example binaries this process built, one per build tag
// set: the runs of a test binary go side by side and share them, rather
// than each compiling the same example on a shared machine.
var builds struct {
	mu  sync.Mutex
	dir string
	m   map[bool]*build // by "tagged with plantTag"
}

// build is one example binary, ready when done is closed.
type build struct {
	done chan struct{}
	path string
	err  error
}

// buildExample returns the example binary of the workspace at root, built
// with plantTag when tagged, building it on the first call.
func buildExample(ctx context.Context, root string, tagged bool) (string, error) {
	builds.mu.Lock()
	b, found := builds.m[tagged]
	if !found {
		if builds.dir == "" {
			dir, err := os.MkdirTemp("", "idemgate-chaos-build-")
			if err != nil {
				builds.mu.Unlock()
				return "", fmt.Errorf("chaos: build dir: %w", err)
			}
			builds.dir, builds.m = dir, map[bool]*build{}
		}
		b = &build{done: make(chan struct{}), path: filepath.Join(builds.dir, fmt.Sprintf("example-tagged-%v", tagged))}
		builds.m[tagged] = b
	}
	builds.mu.Unlock()
	if found {
		select {
		case <-b.done:
			return b.path, b.err
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	defer close(b.done)
	// -trimpath: the build cache then serves copies of the tree in other
	// directories too (tools/mutate runs the soak in scratch copies).
	args := []string{"build", "-trimpath", "-o", b.path}
	if tagged {
		args = append(args, "-tags", plantTag)
	}
	args = append(args, "./example")
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	err := devserver.StartChild(cmd)
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		b.err = fmt.Errorf("chaos: go %s: %w\n%s", strings.Join(args, " "), err, out.String())
		builds.mu.Lock()
		delete(builds.m, tagged) // the next run tries again
		builds.mu.Unlock()
	}
	return b.path, b.err
}

// removeBuilds removes the binaries this process built.
func removeBuilds() {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.dir != "" {
		os.RemoveAll(builds.dir)
	}
	builds.dir, builds.m = "", nil
}

// api returns the API nodes.
func (s *system) api() []*proc { return s.procs[:2] }

// byName returns the process called name.
func (s *system) byName(name string) *proc {
	for _, p := range s.procs {
		if p.name == name {
			return p
		}
	}
	return nil
}

// workerRunning matches the line a worker process prints once it runs:
// "idemgate example worker running (…)", or with its name (WORKER_NAME)
// "idemgate example worker worker0 running (…)".
var workerRunning = regexp.MustCompile(`(?m)^idemgate example worker (\S+ )?running \(`)

// waitReady waits until an API node answers /healthz with 200, or a worker
// says it runs.
func (s *system) waitReady(ctx context.Context, p *proc, within time.Duration) error {
	deadline := time.Now().Add(within)
	hc := &http.Client{Timeout: time.Second}
	for {
		if p.kind == apiNode {
			resp, err := hc.Get(p.url() + "/healthz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return nil
				}
			}
		} else if b, err := os.ReadFile(p.logf); err == nil && workerRunning.Match(b) {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("chaos: %s not ready within %v:\n%s", p.name, within, tailFile(p.logf, 20))
		}
		if !p.running() {
			return fmt.Errorf("chaos: %s %w:\n%s", p.name, errExited, tailFile(p.logf, 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop ends every process and server and closes the proxies. The run is
// over, so processes are killed, not shut down: that is quicker and was
// tested all along. The run directory stays; remove it with s.dir.
func (s *system) stop() {
	for _, p := range s.procs {
		p.signal(syscall.SIGCONT)
		p.kill()
	}
	for _, p := range s.procs {
		for _, l := range p.links {
			l.Close()
		}
	}
	if s.redis != nil {
		s.redis.Stop()
	}
	if s.pg != nil {
		s.pg.Stop()
	}
}

// ---- processes ----

// start runs the process (again), appending its output to its log file.
func (p *proc) start(bin string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.startLocked(bin)
}

// restartIfExited starts the process again when its run ended on its own:
// not killed by kill (held), not yet started. It reports whether it did.
// The test and the start are one step under p.mu.
func (p *proc) restartIfExited(bin string) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.held {
		return false, nil
	}
	select {
	case <-p.done:
	default:
		return false, nil
	}
	return true, p.startLocked(bin)
}

// startLocked starts a run unless one runs already: whoever asked (a
// fault's end, healAll, supervise) wants the process up, and a second run
// would be one nobody tracks (faults and stop would never reach it).
func (p *proc) startLocked(bin string) error {
	if p.done != nil {
		select {
		case <-p.done:
		default:
			p.held = false
			return nil
		}
	}
	f, err := os.OpenFile(p.logf, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("chaos: log of %s: %w", p.name, err)
	}
	defer f.Close()
	fmt.Fprintf(f, "chaos: start %s at %s\n", p.name, time.Now().UTC().Format(time.RFC3339Nano))
	cmd := exec.Command(bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := devserver.StartChild(cmd); err != nil {
		return fmt.Errorf("chaos: start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.cmd, p.done, p.paused, p.held = cmd, done, false, false
	return nil
}

// exited is closed when the current run of the process has ended.
func (p *proc) exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return p.done
}

// running reports whether the process runs (paused counts as running).
func (p *proc) running() bool {
	select {
	case <-p.exited():
		return false
	default:
		return true
	}
}

func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(sig)
		switch sig {
		case syscall.SIGSTOP:
			p.paused = true
		case syscall.SIGCONT, syscall.SIGKILL:
			p.paused = false
		}
	}
}

// kill SIGKILLs the process and waits until it is gone. It stays down,
// left alone by supervise, until start runs it again.
func (p *proc) kill() {
	p.mu.Lock()
	p.held = true
	p.mu.Unlock()
	p.signal(syscall.SIGKILL)
	<-p.exited()
}

// ---- logs ----

// logLine matches the slog text lines of the example's workers that say
// how a generator call or a reconcile ended.
var logLine = regexp.MustCompile(`^time=(\S+) level=\S+ msg="(task [^"]*)" task=(\S+)`)

// genCalls reads the generator calls of process name from its log: a
// "task done", "task failed…" or "task uncertain…" line ends a call;
// "task reconciled…" is a reconcile query; other lines are no call.
func genCalls(name, path string) ([]GenCall, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []GenCall
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	reconciled := map[string]time.Time{}
	for sc.Scan() {
		g, ok := parseLogLine(name, sc.Text())
		switch {
		case !ok:
		case g.Phase == "reconcile":
			reconciled[g.Task] = g.At
			out = append(out, g)
		case g.At.Sub(reconciled[g.Task]) < reconcileEcho:
			// The outcome a reconcile found, logged as the task's end
			// right after "task reconciled": no generation.
		default:
			out = append(out, g)
		}
	}
	return out, sc.Err()
}

// reconcileEcho is how soon after a "task reconciled" line an outcome line
// of the same task is the reconcile's own outcome, not a generator call.
const reconcileEcho = 100 * time.Millisecond

// parseLogLine reads one worker log line: a generator call's end, a
// reconcile, or nothing (ok false).
func parseLogLine(proc, line string) (GenCall, bool) {
	m := logLine.FindStringSubmatch(line)
	if m == nil {
		return GenCall{}, false
	}
	at, err := time.Parse(time.RFC3339Nano, m[1])
	if err != nil {
		return GenCall{}, false
	}
	g := GenCall{Task: m[3], Proc: proc, Phase: "end", Result: resultOf(m[2]), At: at}
	switch {
	case strings.HasPrefix(m[2], "task reconciled"):
		g.Phase, g.Result = "reconcile", ""
	case g.Result == m[2]:
		return GenCall{}, false // another message about a task: no call
	}
	return g, true
}

// resultOf shortens a worker's log message to the call's result.
func resultOf(msg string) string {
	switch {
	case strings.HasPrefix(msg, "task done"):
		return "done"
	case strings.HasPrefix(msg, "task uncertain"):
		return "uncertain"
	case strings.HasPrefix(msg, "task failed with partial"):
		return "partial"
	case strings.HasPrefix(msg, "task failed"):
		return "failed"
	}
	return msg
}

// tailFile returns the last n lines of a file, for error messages.
func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
