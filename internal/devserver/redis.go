package devserver

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Redis is a throwaway redis-server on loopback without persistence.
type Redis struct {
	*Server
	// Port is the TCP port on 127.0.0.1.
	Port int
	// BusPort is a cluster node's bus port, 0 when it is not one.
	BusPort int

	bin   string
	extra []string
}

// StartRedis starts redis-server on a free port with no persistence and
// `databases` logical databases (0 for the default of 16). The error wraps
// ErrMissing when redis-server is not installed.
func StartRedis(ctx context.Context, databases int, extra ...string) (*Redis, error) {
	return startRedis(ctx, databases, false, extra...)
}

// clusterArgs make redis-server a cluster node.
var clusterArgs = []string{"--cluster-enabled", "yes",
	"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000"}

// startRedis is StartRedis; a cluster node of redis-server 7 or later also
// gets a bus port of its own from FreePort. Left to itself, redis-server
// puts the bus at port+10000, which can land in the kernel's ephemeral
// range, where an outgoing connection can hold it. (Older servers know no
// --cluster-port: a node whose bus port is taken exits, and the PING wait
// and the retries below start it on other ports.)
func startRedis(ctx context.Context, databases int, cluster bool, extra ...string) (*Redis, error) {
	bin, err := lookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("%w (install it, e.g. apt-get install redis-server)", err)
	}
	dir, err := makeDir("redis")
	if err != nil {
		return nil, err
	}
	if databases > 0 {
		extra = append([]string{"--databases", strconv.Itoa(databases)}, extra...)
	}
	if cluster {
		extra = append(append([]string{}, clusterArgs...), extra...)
	}
	r := &Redis{bin: bin, extra: extra}
	ownBus := cluster && takesClusterPort(bin)
	for attempt := 0; ; attempt++ {
		port, bus, err := freePorts(ownBus)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		srv, err := r.start(ctx, dir, port, bus)
		if err == nil {
			r.Server, r.Port, r.BusPort = srv, port, bus
			return r, nil
		}
		if attempt == 3 || ctx.Err() != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
}

// takesClusterPort reports whether the redis-server at bin is 7.0 or later,
// the first to take --cluster-port.
func takesClusterPort(bin string) bool {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return false
	}
	_, v, ok := strings.Cut(string(out), " v=")
	if !ok {
		return false
	}
	major, _, _ := strings.Cut(v, ".")
	n, err := strconv.Atoi(major)
	return err == nil && n >= 7
}

// freePorts returns a free port, and a second, different one for a
// cluster node's bus.
func freePorts(cluster bool) (port, bus int, err error) {
	if port, err = FreePort(); err != nil || !cluster {
		return port, 0, err
	}
	for range 16 {
		if bus, err = FreePort(); err != nil || bus != port {
			return port, bus, err
		}
	}
	return 0, 0, fmt.Errorf("devserver: no second free port beside %d", port)
}

// start runs redis-server on port (and a cluster node's bus on busPort when
// it is not 0) and returns once it answers PING.
func (r *Redis) start(ctx context.Context, dir string, port, busPort int) (*Server, error) {
	logPath := filepath.Join(dir, "redis.log")
	args := []string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir,
		"--logfile", logPath, "--protected-mode", "no",
	}
	if busPort != 0 {
		args = append(args, "--cluster-port", strconv.Itoa(busPort))
	}
	args = append(args, r.extra...)
	cmd := exec.Command(r.bin, args...)
	srv, err := startChild(cmd)
	if err != nil {
		return nil, fmt.Errorf("devserver: start redis-server: %w", err)
	}
	srv.Dir = dir
	srv.Addr = fmt.Sprintf("127.0.0.1:%d", port)
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	logf := func() string { return tail(logPath) }
	if err := waitTCP(waitCtx, srv, srv.Addr, logf); err != nil {
		_ = srv.Kill()
		return nil, err
	}
	// redis-server accepts on its port before it has finished starting: a
	// cluster node whose bus port is taken accepts and then exits. A PONG
	// comes only from a server that has.
	if err := waitPong(waitCtx, srv, srv.Addr, logf); err != nil {
		_ = srv.Kill()
		return nil, err
	}
	return srv, nil
}

// waitPong waits until the Redis server s on addr answers PING with PONG
// (not, say, -LOADING), or exits, or ctx ends.
func waitPong(ctx context.Context, s *Server, addr string, logf func() string) error {
	return waitUntil(ctx, s, addr, "does not answer PING", logf, func() bool { return pong(ctx, addr) })
}

// pong reports whether the server on addr answers PING within a second as
// a server that has finished starting does: +PONG, or -NOAUTH when it
// wants a password.
func pong(ctx context.Context, addr string) bool {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && (strings.HasPrefix(line, "+PONG") || strings.HasPrefix(line, "-NOAUTH"))
}

// Restart starts redis-server again on the same port after Kill or Stop
// (with empty data: it has no persistence); for fault tests.
func (r *Redis) Restart(ctx context.Context) error {
	select {
	case <-r.done:
	default:
		_ = r.Kill()
	}
	if err := os.MkdirAll(r.Dir, 0o755); err != nil {
		return fmt.Errorf("devserver: redis dir: %w", err)
	}
	srv, err := r.start(ctx, r.Dir, r.Port, r.BusPort)
	if err != nil {
		return err
	}
	r.Server = srv
	return nil
}

// Cluster is a throwaway Redis Cluster of primaries on loopback.
type Cluster struct {
	// Nodes are the primaries, each owning a share of the 16384 slots.
	Nodes []*Redis
}

// Addrs returns the nodes' host:port addresses.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr
	}
	return addrs
}

// Stop stops every node.
func (c *Cluster) Stop() error {
	var first error
	for _, n := range c.Nodes {
		if err := n.Stop(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// StartCluster starts n cluster-enabled redis-servers, joins them with
// redis-cli --cluster create and waits until every node reports
// cluster_state:ok. A cluster that fails to form is stopped and started
// again on other ports: three attempts in all.
func StartCluster(ctx context.Context, n int) (*Cluster, error) {
	cli, err := lookPath("redis-cli")
	if err != nil {
		return nil, fmt.Errorf("%w (install it, e.g. apt-get install redis-tools)", err)
	}
	for attempt := 1; ; attempt++ {
		c, err := startCluster(ctx, cli, n)
		if err == nil || attempt == 3 || ctx.Err() != nil {
			return c, err
		}
	}
}

func startCluster(ctx context.Context, cli string, n int) (*Cluster, error) {
	c := &Cluster{}
	for i := 0; i < n; i++ {
		node, err := startRedis(ctx, 0, true)
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.Nodes = append(c.Nodes, node)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		c.Stop()
		return nil, fmt.Errorf("devserver: redis-cli --cluster create: %w\n%s", err, out)
	}
	deadline := time.Now().Add(time.Minute)
	for _, node := range c.Nodes {
		for {
			out, _ := exec.CommandContext(ctx, cli, "-p", strconv.Itoa(node.Port), "cluster", "info").Output()
			if strings.Contains(string(out), "cluster_state:ok") {
				break
			}
			if ctx.Err() != nil || time.Now().After(deadline) {
				c.Stop()
				return nil, fmt.Errorf("devserver: cluster not ok on %s (%v):\n%s", node.Addr, ctx.Err(), out)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c, nil
}
