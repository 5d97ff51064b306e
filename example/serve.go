package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/idemgate/idemgate/pgstore"
)

// defaultAddr is where serve listens unless ADDR or -addr says otherwise:
// loopback, so that a laptop's dev service is not on its network.
const defaultAddr = "localhost:8080"

// shutdownBudget bounds a graceful shutdown: in-flight requests finish,
// workers hand back their tasks, the stores close.
const shutdownBudget = 10 * time.Second

func cmdServe(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", "Serves the API with in-process workers. Without DATABASE_URL / REDIS_URL it\n"+
		"starts a throwaway PostgreSQL cluster and an in-process miniredis, removed on exit.", stderr)
	var s settings
	addr := getenv("ADDR")
	if addr == "" {
		addr = defaultAddr
	}
	fs.StringVar(&s.addr, "addr", addr, "listen address (env ADDR)")
	s.addStoreFlags(fs, getenv, true)
	s.addWorkerFlags(fs, getenv, 2)
	s.obs.addObsFlags(fs, getenv, stdout)
	s.limits.addFlags(fs, getenv)
	fs.DurationVar(&s.idemLease, "idem-lease", envDuration(getenv, "IDEM_LEASE", 0),
		"how long an idempotency claim lives without renewal (env IDEM_LEASE); 0: the middleware's default")
	addTenantLimitFlags(fs, getenv, &s.exportLimit, &s.submitLimit)
	fs.DurationVar(&s.exportTime, "export-time", envDuration(getenv, "EXPORT_TIME", 0),
		"how long the stand-in export renderer takes (env EXPORT_TIME); 0: "+exportRenderTime.String())
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := s.limits.validate(); err != nil {
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	n, err := startNode(ctx, s, logger, stderr)
	if err != nil {
		return err
	}
	n.printStartup(stdout)
	select {
	case <-ctx.Done():
		fmt.Fprintln(stdout, "shutting down")
	case err = <-n.served:
	}
	if serr := n.shutdown(); err == nil {
		err = serr
	}
	if n.b.throwaway != "" {
		fmt.Fprintf(stdout, "removed the throwaway cluster %s\n", n.b.throwaway)
	}
	return err
}

// serverLimits bound how long a client may hold the server (headers or a
// body trickled byte by byte, a response it does not read, a keep-alive
// connection left idle) and how much header it may send. A zero field
// takes its default.
type serverLimits struct {
	readHeader, read, write, idle time.Duration
	maxHeader                     int // bytes of request line and headers
}

// Defaults of serverLimits. A request body of the API is at most 1 MiB
// (the middleware's MaxBodyBytes), so 10 s to read a whole request is
// generous for any real client and short for a trickle. The write timeout
// runs from the end of the request's headers to the end of the response,
// so it covers the handler too: WaitInFlight (2 s) and the idempotency
// store's calls fit in it many times over.
const (
	defaultReadHeaderTimeout = 5 * time.Second
	defaultReadTimeout       = 10 * time.Second
	defaultWriteTimeout      = 30 * time.Second
	defaultIdleTimeout       = 60 * time.Second
	// net/http's default (1 MiB) lets every request make the server read
	// and keep a megabyte of headers; the API's largest header is a bearer
	// token of a few hundred bytes.
	defaultMaxHeaderBytes = 64 << 10
)

func (l *serverLimits) addFlags(fs *flag.FlagSet, getenv func(string) string) {
	fs.DurationVar(&l.readHeader, "read-header-timeout", envDuration(getenv, "READ_HEADER_TIMEOUT", defaultReadHeaderTimeout),
		"time to read a request's headers (env READ_HEADER_TIMEOUT)")
	fs.DurationVar(&l.read, "read-timeout", envDuration(getenv, "READ_TIMEOUT", defaultReadTimeout),
		"time to read a whole request, body included; a slower one is cut off (env READ_TIMEOUT)")
	fs.DurationVar(&l.write, "write-timeout", envDuration(getenv, "WRITE_TIMEOUT", defaultWriteTimeout),
		"time from the end of a request's headers to the end of its response (env WRITE_TIMEOUT)")
	fs.DurationVar(&l.idle, "idle-timeout", envDuration(getenv, "IDLE_TIMEOUT", defaultIdleTimeout),
		"how long an idle keep-alive connection stays open (env IDLE_TIMEOUT)")
	fs.IntVar(&l.maxHeader, "max-header-bytes", envInt(getenv, "MAX_HEADER_BYTES", defaultMaxHeaderBytes),
		"most bytes of request line and headers; more is answered 431 (env MAX_HEADER_BYTES)")
}

// validate refuses negative limits: net/http would set deadlines in the
// past and fail every request.
func (l serverLimits) validate() error {
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"read-header-timeout", l.readHeader}, {"read-timeout", l.read}, {"write-timeout", l.write}, {"idle-timeout", l.idle}} {
		if d.v < 0 {
			return fmt.Errorf("-%s must not be negative, got %v", d.flag, d.v)
		}
	}
	if l.maxHeader < 0 {
		return fmt.Errorf("-max-header-bytes must not be negative, got %d", l.maxHeader)
	}
	return nil
}

// server returns an HTTP server for h under the limits.
func (l serverLimits) server(h http.Handler) *http.Server {
	or := func(d, def time.Duration) time.Duration {
		if d <= 0 {
			return def
		}
		return d
	}
	maxHeader := l.maxHeader
	if maxHeader <= 0 {
		maxHeader = defaultMaxHeaderBytes
	}
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: or(l.readHeader, defaultReadHeaderTimeout),
		ReadTimeout:       or(l.read, defaultReadTimeout),
		WriteTimeout:      or(l.write, defaultWriteTimeout),
		IdleTimeout:       or(l.idle, defaultIdleTimeout),
		MaxHeaderBytes:    maxHeader,
	}
}

// node is one serving process: HTTP API, in-process workers, stores.
type node struct {
	settings settings
	b        *backends
	ln       net.Listener
	srv      *http.Server
	served   chan error // receives the HTTP server's exit error
	workers  *workerPool
	policy   map[string]pgstore.LostPolicy // what the workers do with a lost attempt
	devToken string                        // a token to print, only when the dev secret is used
	obs      *observer
	admin    *admin
}

// startNode opens the stores, starts the workers and listens.
func startNode(ctx context.Context, s settings, logger *slog.Logger, stderr io.Writer) (*node, error) {
	n := &node{settings: s, served: make(chan error, 1)}
	// Listen first: a busy port should fail before a cluster is made.
	var err error
	n.ln, err = net.Listen("tcp", s.addr)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	secret, dev, err := serveSecret(s, n.ln.Addr(), stderr)
	if err != nil {
		n.ln.Close()
		return nil, err
	}
	if dev {
		tok, err := mintToken(secret, "acme", "alice", time.Now(), 24*time.Hour)
		if err != nil {
			n.ln.Close()
			return nil, err
		}
		n.devToken = tok
	}
	if s.databaseURL == "" {
		fmt.Fprintln(stderr, "starting a throwaway PostgreSQL cluster (a few seconds)...")
	}
	b, err := openBackends(ctx, s, true, true)
	if err != nil {
		n.ln.Close()
		return nil, err
	}
	n.b = b
	if n.obs, n.admin, err = startObs(ctx, s.obs, "serve", b.store, stderr); err != nil {
		n.ln.Close()
		b.close()
		return nil, err
	}
	// Requests are served only after openBackends migrated the schema.
	a := &api{store: b.store, pool: b.pool, redis: b.redis, records: b.records, secret: secret, logger: logger, obs: n.obs,
		lease: s.idemLease, exportTime: s.exportTime, exportLimit: s.exportLimit, submitLimit: s.submitLimit}
	wo, err := s.workerOptions()
	if err == nil {
		n.workers, err = runWorkers(b, wo, logger, n.obs)
		n.policy = wo.policy
	}
	if err != nil {
		n.ln.Close()
		b.close()
		return nil, err
	}
	n.srv = s.limits.server(withPage(a.handler(), n.obs, secret, dev))
	go func() {
		err := n.srv.Serve(n.ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		n.served <- err
	}()
	return n, nil
}

// url is the base URL to reach the node from this machine.
func (n *node) url() string {
	tcp := n.ln.Addr().(*net.TCPAddr)
	host := tcp.IP.String()
	if tcp.IP.IsUnspecified() {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, fmt.Sprint(tcp.Port))
}

// printStartup says where the node listens, what it uses, and how to try it.
func (n *node) printStartup(w io.Writer) {
	u := n.url()
	fmt.Fprintf(w, "idemgate example listening on %s (%d workers)\n", u, n.settings.workers)
	fmt.Fprintf(w, "  postgres: %s\n", n.b.pgInfo)
	fmt.Fprintf(w, "  redis:    %s\n", n.b.redisInfo)
	if n.settings.workers > 0 {
		fmt.Fprintf(w, "  policy: %s\n", formatPolicy(n.policy))
	}
	printObs(w, u, n.admin, n.obs)
	if n.devToken != "" {
		fmt.Fprintf(w, "Try it (dev token: tenant acme, user alice, 24h):\n  TOKEN=%s\n", n.devToken)
	} else {
		fmt.Fprintf(w, "Try it:\n  TOKEN=$(go run ./example token -tenant acme -user alice)\n")
	}
	fmt.Fprintf(w, "  curl -si %s/v1/images -H \"Authorization: Bearer $TOKEN\" -H 'Idempotency-Key: poster:launch:1' "+
		"-H 'Content-Type: application/json' -d '{\"prompt\":\"a lighthouse at dawn\",\"aspect_ratio\":\"16:9\",\"n\":2}'\n", u)
	fmt.Fprintf(w, "  curl -s %s/v1/tasks/TASK_ID -H \"Authorization: Bearer $TOKEN\"\n", u)
	fmt.Fprintln(w, "Ctrl-C stops it.")
}

// shutdown stops accepting requests, lets in-flight ones and the workers'
// current tasks end (or hand them back), and closes the stores, within
// shutdownBudget.
func (n *node) shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownBudget-2*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- n.srv.Shutdown(ctx) }()
	n.workers.stop(ctx)
	err := <-done
	err = errors.Join(err, n.admin.close(ctx), n.obs.shutdown(ctx))
	n.b.close()
	return err
}

func cmdWorker(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("worker", "Runs workers only, against a shared DATABASE_URL (the API runs elsewhere).", stderr)
	var s settings
	s.addStoreFlags(fs, getenv, false)
	s.addWorkerFlags(fs, getenv, 2)
	s.obs.addObsFlags(fs, getenv, stdout)
	if err := parse(fs, args); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	b, err := openBackends(ctx, s, false, false)
	if err != nil {
		return err
	}
	defer b.close()
	obs, adm, err := startObs(ctx, s.obs, "worker", nil, stderr)
	if err != nil {
		return err
	}
	wo, err := s.workerOptions()
	var w *workerPool
	if err == nil {
		w, err = runWorkers(b, wo, logger, obs)
	}
	if err != nil {
		_ = adm.close(ctx)
		_ = obs.shutdown(ctx)
		return err
	}
	fmt.Fprintf(stdout, "idemgate example worker %s running (%d workers)\n  postgres: %s\n  policy: %s\n",
		wo.name, s.workers, b.pgInfo, formatPolicy(wo.policy))
	printAdmin(stdout, adm)
	<-ctx.Done()
	fmt.Fprintln(stdout, "shutting down")
	stopCtx, cancel := context.WithTimeout(context.Background(), shutdownBudget-2*time.Second)
	defer cancel()
	w.stop(stopCtx)
	return errors.Join(adm.close(stopCtx), obs.shutdown(stopCtx))
}

func cmdMigrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("migrate", "Creates or upgrades the task schema in DATABASE_URL; safe to run from many nodes at once.", stderr)
	var s settings
	s.addStoreFlags(fs, getenv, false)
	if err := parse(fs, args); err != nil {
		return err
	}
	b, err := openBackends(ctx, s, false, false)
	if err != nil {
		return err
	}
	defer b.close()
	fmt.Fprintf(stdout, "migrated %s\n", b.pgInfo)
	return nil
}
