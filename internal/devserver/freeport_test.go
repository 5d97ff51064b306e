package devserver

import (
	"net"
	"strconv"
	"testing"
)

// A server restarted on its port must find it free: FreePort's ports lie
// below the kernel's ephemeral range, where no outgoing connection takes
// its local port, and are free to listen on.
func TestFreePortIsOutsideTheEphemeralRange(t *testing.T) {
	t.Parallel()
	lo := ephemeralLow()
	if lo <= 2048 {
		t.Skipf("ephemeral range starts at %d: no room below it", lo)
	}
	for range 20 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if port >= lo || port < 1024 {
			t.Fatalf("FreePort() = %d; want a port in [1024, %d)", port, lo)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("FreePort() = %d, not free: %v", port, err)
		}
		l.Close()
	}
}
