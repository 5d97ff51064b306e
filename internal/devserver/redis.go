package devserver

import (
	"context"
	"fmt"
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

	bin   string
	extra []string
}

// StartRedis starts redis-server on a free port with no persistence and
// `databases` logical databases (0 for the default of 16). The error wraps
// ErrMissing when redis-server is not installed.
func StartRedis(ctx context.Context, databases int, extra ...string) (*Redis, error) {
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
	r := &Redis{bin: bin, extra: extra}
	for attempt := 0; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		srv, err := r.start(ctx, dir, port)
		if err == nil {
			r.Server, r.Port = srv, port
			return r, nil
		}
		if attempt == 3 || ctx.Err() != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
}

func (r *Redis) start(ctx context.Context, dir string, port int) (*Server, error) {
	logPath := filepath.Join(dir, "redis.log")
	args := append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir,
		"--logfile", logPath, "--protected-mode", "no",
	}, r.extra...)
	cmd := exec.Command(r.bin, args...)
	srv, err := startChild(cmd)
	if err != nil {
		return nil, fmt.Errorf("devserver: start redis-server: %w", err)
	}
	srv.Dir = dir
	srv.Addr = fmt.Sprintf("127.0.0.1:%d", port)
	waitCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := waitTCP(waitCtx, srv, srv.Addr, func() string { return tail(logPath) }); err != nil {
		_ = srv.Kill()
		return nil, err
	}
	return srv, nil
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
	srv, err := r.start(ctx, r.Dir, r.Port)
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
// redis-cli --cluster create and waits until every node reports cluster_state:ok.
func StartCluster(ctx context.Context, n int) (*Cluster, error) {
	cli, err := lookPath("redis-cli")
	if err != nil {
		return nil, fmt.Errorf("%w (install it, e.g. apt-get install redis-tools)", err)
	}
	c := &Cluster{}
	for i := 0; i < n; i++ {
		node, err := StartRedis(ctx, 0, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000")
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
	deadline := time.Now().Add(20 * time.Second)
	for _, node := range c.Nodes {
		for {
			out, _ := exec.CommandContext(ctx, cli, "-p", strconv.Itoa(node.Port), "cluster", "info").Output()
			if strings.Contains(string(out), "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				c.Stop()
				return nil, fmt.Errorf("devserver: cluster not ok on %s:\n%s", node.Addr, out)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c, nil
}
