package devserver

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

func needRedis(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if testing.Short() {
			t.Skip("redis-server not installed")
		}
		t.Fatal("redis-server not installed (apt-get install redis-server)")
	}
}

// TestClusterNodeWhoseBusPortIsTakenIsNotReportedUp holds the port a
// cluster node's bus would listen on. redis-server then accepts on its
// client port and exits a few milliseconds later ("Failed listening on port
// … (cluster), aborting"): a start that waited only for the client port
// handed out a dead node, and redis-cli --cluster create met "connection
// refused" (CI, stop 37).
func TestClusterNodeWhoseBusPortIsTakenIsNotReportedUp(t *testing.T) {
	needRedis(t)
	dir, err := makeDir("redis")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	tried := 0
	for round := 0; round < 20 && tried < 5; round++ {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		if err != nil {
			continue // that port is someone else's: try another
		}
		tried++
		r := &Redis{extra: clusterArgs}
		r.bin, _ = exec.LookPath("redis-server")
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		srv, err := r.start(ctx, dir, port, 0)
		cancel()
		bus.Close()
		if err == nil {
			srv.Kill()
			t.Fatalf("round %d: a node whose bus port %d was taken was reported up", round, port+10000)
		}
		if !strings.Contains(err.Error(), "exited") || !strings.Contains(err.Error(), "Failed listening on port") {
			t.Fatalf("round %d: the start failed, but not on its taken bus port: %v", round, err)
		}
		os.Remove(dir + "/nodes.conf")
	}
	if tried == 0 {
		t.Fatal("no port had its port+10000 free to hold")
	}
}

// TestClusterNodesListenOnTheirBusPorts starts a cluster and checks that
// each node's bus listens on the port chosen for it, outside the kernel's
// ephemeral range, where an outgoing connection can hold it (redis-server 7
// and later; older ones know no --cluster-port).
func TestClusterNodesListenOnTheirBusPorts(t *testing.T) {
	needRedis(t)
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatal("redis-cli not installed (apt-get install redis-tools)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := StartCluster(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	if !takesClusterPort(c.Nodes[0].bin) {
		t.Skip("redis-server before 7.0 takes no --cluster-port")
	}
	lo := ephemeralLow()
	for _, n := range c.Nodes {
		if n.BusPort == 0 || n.BusPort == n.Port {
			t.Fatalf("node %s: bus port %d", n.Addr, n.BusPort)
		}
		if lo > 2048 && n.BusPort >= lo {
			t.Errorf("node %s: bus port %d is in the ephemeral range (from %d)", n.Addr, n.BusPort, lo)
		}
		conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(n.BusPort), time.Second)
		if err != nil {
			t.Errorf("node %s: bus port %d: %v", n.Addr, n.BusPort, err)
			continue
		}
		conn.Close()
	}
}
