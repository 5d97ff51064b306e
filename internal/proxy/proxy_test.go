package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// echoServer answers every line with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String()
}

func startProxy(t *testing.T) *Proxy {
	t.Helper()
	p, err := Start(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

type conn struct {
	net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, p *Proxy) *conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &conn{Conn: c, r: bufio.NewReader(c)}
}

// roundTrip sends a line and reads the answer, giving up after wait.
func (c *conn) roundTrip(line string, wait time.Duration) (string, error) {
	c.SetDeadline(time.Now().Add(wait))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		return "", err
	}
	got, err := c.r.ReadString('\n')
	if len(got) > 0 {
		got = got[:len(got)-1]
	}
	return got, err
}

func TestModes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		mode     Mode
		wantEcho bool // an answer comes within the short wait
		wantDead bool // the connection is gone after healing
	}{
		{name: "pass", mode: Pass, wantEcho: true},
		{name: "freeze holds bytes until healed", mode: Freeze},
		{name: "drop loses bytes and closes on heal", mode: Drop, wantDead: true},
		{name: "cut closes the connection", mode: Cut, wantDead: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := startProxy(t)
			c := dial(t, p)
			if got, err := c.roundTrip("warm", 5*time.Second); err != nil || got != "warm" {
				t.Fatalf("before the fault: %q, %v", got, err)
			}
			p.Set(tc.mode, 0)
			// An echo that should come gets patience (a loaded machine
			// missed 300 ms, 8 December 2026); one that should not come is
			// given 300 ms to show up.
			wait := 300 * time.Millisecond
			if tc.wantEcho {
				wait = 30 * time.Second
			}
			got, err := c.roundTrip("during", wait)
			if tc.wantEcho != (err == nil && got == "during") {
				t.Fatalf("during %v: got %q, %v; want echo %v", tc.mode, got, err, tc.wantEcho)
			}
			p.Heal()
			if tc.mode == Freeze {
				// The held line arrives after healing, in order.
				c.SetDeadline(time.Now().Add(5 * time.Second))
				line, err := c.r.ReadString('\n')
				if err != nil || line != "during\n" {
					t.Fatalf("after healing a freeze: %q, %v; want the held line", line, err)
				}
			}
			got, err = c.roundTrip("after", 2*time.Second)
			if dead := err != nil; dead != tc.wantDead {
				t.Fatalf("after healing %v: got %q, %v; want dead %v", tc.mode, got, err, tc.wantDead)
			}
			// A new connection always works once healed.
			if got, err := dial(t, p).roundTrip("fresh", 5*time.Second); err != nil || got != "fresh" {
				t.Fatalf("new connection after healing: %q, %v", got, err)
			}
		})
	}
}

func TestCutRefusesNewConnections(t *testing.T) {
	t.Parallel()
	p := startProxy(t)
	p.Set(Cut, 0)
	c := dial(t, p)
	if _, err := c.roundTrip("x", 2*time.Second); err == nil {
		t.Fatal("a connection made during a cut answered")
	}
}

func TestDelay(t *testing.T) {
	t.Parallel()
	p := startProxy(t)
	c := dial(t, p)
	p.Set(Delay, time.Hour)
	if _, err := c.roundTrip("slow", 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("an hour's delay answered within the wait: %v", err)
	}
	// Healing releases the delayed chunk at once.
	p.Heal()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if line, err := c.r.ReadString('\n'); err != nil || line != "slow\n" {
		t.Fatalf("after healing a delay: %q, %v", line, err)
	}
}

// TestConcurrent flips modes while many connections talk; run with -race.
func TestConcurrent(t *testing.T) {
	t.Parallel()
	p := startProxy(t)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.DialTimeout("tcp", p.Addr, time.Second)
				if err != nil {
					continue
				}
				r := bufio.NewReader(c)
				c.SetDeadline(time.Now().Add(50 * time.Millisecond))
				fmt.Fprintf(c, "%d-%d\n", i, j)
				r.ReadString('\n')
				c.Close()
			}
		}()
	}
	modes := []Mode{Delay, Drop, Freeze, Cut, SlowReplies, Pass}
	for i := range 200 {
		p.Set(modes[i%len(modes)], time.Millisecond)
		time.Sleep(time.Millisecond)
	}
	close(stop)
	p.Heal()
	wg.Wait()
	if got, err := dial(t, p).roundTrip("end", 5*time.Second); err != nil || got != "end" {
		t.Fatalf("after the storm: %q, %v", got, err)
	}
}

// TestDelayReplies: the next reply is held back by the delay while the
// request passes at once; later replies come at once again.
func TestDelayReplies(t *testing.T) {
	t.Parallel()
	p, err := Start(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := bufio.NewReader(c)
	roundTrip := func() time.Duration {
		t.Helper()
		start := time.Now()
		if _, err := c.Write([]byte("ping\n")); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if line, err := r.ReadString('\n'); err != nil || line != "ping\n" {
			t.Fatalf("read = %q, %v", line, err)
		}
		return time.Since(start)
	}
	const delay = 3 * time.Second // far above a round trip on a loaded machine
	p.DelayReplies(1, delay)
	if got := roundTrip(); got < delay {
		t.Errorf("held-back reply came after %v, want at least %v", got, delay)
	}
	if n := p.DelayedRepliesLeft(); n != 0 {
		t.Errorf("DelayedRepliesLeft = %d, want 0", n)
	}
	if got := roundTrip(); got >= delay {
		t.Errorf("next reply came after %v, want at once", got)
	}
}

// TestSlowReplies: the request reaches the server at once while its reply
// is held back by the delay; healing releases the held reply at once.
func TestSlowReplies(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	seen := make(chan string, 1) // each line as the server receives it
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			seen <- line
			if _, err := c.Write([]byte(line)); err != nil {
				return
			}
		}
	}()
	p, err := Start(l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	c := dial(t, p)
	if got, err := c.roundTrip("warm", 5*time.Second); err != nil || got != "warm" {
		t.Fatalf("before slowing: %q, %v", got, err)
	}
	<-seen

	p.Set(SlowReplies, time.Hour)
	if got, err := c.roundTrip("slow", 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("an hour's reply delay answered within the wait: %q, %v", got, err)
	}
	select {
	case line := <-seen:
		if line != "slow\n" {
			t.Fatalf("server received %q, want the request", line)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the request did not reach the server: SlowReplies held the client's bytes too")
	}
	p.Heal()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if line, err := c.r.ReadString('\n'); err != nil || line != "slow\n" {
		t.Fatalf("after healing: %q, %v; want the held reply", line, err)
	}
	if got := SlowReplies.String(); got != "slow-replies" {
		t.Errorf("SlowReplies.String() = %q", got)
	}
}
