// Package proxy is a loopback TCP proxy whose link can be made to misbehave
// on command: delayed (both ways, or only the server's replies), dropped
// (blackholed), frozen or cut, or with only the server's next replies held
// back (DelayReplies). Fault tests put one between a process and the server
// it talks to (Redis, Postgres) and turn the link bad and good again while
// the process runs.
package proxy

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is the state of a proxy's link.
type Mode int

const (
	// Pass forwards bytes at once, both ways.
	Pass Mode = iota
	// Delay holds every chunk back by the proxy's delay before forwarding it.
	Delay
	// Drop reads and discards every byte, both ways: a blackhole. The
	// connections stay open; when the link heals they are closed, since
	// their streams lost bytes.
	Drop
	// Freeze holds every byte until the link heals, then delivers it in
	// order: a stopped network, not a lossy one.
	Freeze
	// Cut closes every connection and refuses new ones until the link heals.
	Cut
	// SlowReplies holds every chunk the upstream sends back by the proxy's
	// delay before forwarding it; what the clients send passes at once. A
	// request reaches the server and runs while its answer comes late, and
	// one that comes after the client gave up is a lost reply, not a lost
	// request. Like Delay, a change of mode releases the held chunk.
	SlowReplies
)

func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Delay:
		return "delay"
	case Drop:
		return "drop"
	case Freeze:
		return "freeze"
	case Cut:
		return "cut"
	case SlowReplies:
		return "slow-replies"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Proxy forwards connections accepted on Addr to an upstream address.
// Its methods are safe for concurrent use.
type Proxy struct {
	// Addr is host:port that clients dial.
	Addr string

	l        net.Listener
	upstream string

	mu     sync.Mutex
	mode   Mode
	delay  time.Duration
	change chan struct{} // closed and replaced whenever mode changes
	conns  map[*link]struct{}
	closed bool
	wg     sync.WaitGroup

	lateReplies atomic.Int64 // upstream chunks still to hold back
	lateDelay   atomic.Int64 // by this many nanoseconds
}

// link is one client connection and its upstream connection.
type link struct {
	client, server net.Conn
	once           sync.Once
}

func (k *link) close() {
	k.once.Do(func() {
		k.client.Close()
		k.server.Close()
	})
}

// Start listens on a free loopback port and forwards to upstream.
func Start(upstream string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy: listen: %w", err)
	}
	p := &Proxy{Addr: l.Addr().String(), l: l, upstream: upstream,
		change: make(chan struct{}), conns: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Set puts the link in mode m; delay applies to Delay and SlowReplies. Leaving Drop
// closes the connections that lost bytes; entering Cut closes them all.
func (p *Proxy) Set(m Mode, delay time.Duration) {
	p.mu.Lock()
	prev := p.mode
	p.mode, p.delay = m, delay
	close(p.change)
	p.change = make(chan struct{})
	var doomed []*link
	if m == Cut || (prev == Drop && m != Drop) {
		for k := range p.conns {
			doomed = append(doomed, k)
			delete(p.conns, k)
		}
	}
	p.mu.Unlock()
	for _, k := range doomed {
		k.close()
	}
}

// DelayReplies holds back each of the next n chunks that the upstream
// sends (on any connection) by d before the mode forwards it; what the
// clients send passes as the mode says. A request reaches the server and
// runs, and its answer arrives after the client may have given up: a lost
// reply, not a lost request. Calls replace what is left of the last one.
func (p *Proxy) DelayReplies(n int, d time.Duration) {
	p.lateDelay.Store(int64(d))
	p.lateReplies.Store(int64(n))
}

// DelayedRepliesLeft returns how many of the replies that DelayReplies
// asked to hold back have not arrived from the upstream yet.
func (p *Proxy) DelayedRepliesLeft() int { return int(max(p.lateReplies.Load(), 0)) }

// Heal is Set(Pass, 0).
func (p *Proxy) Heal() { p.Set(Pass, 0) }

// Mode returns the current mode.
func (p *Proxy) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Close stops listening, closes every connection and waits for the
// forwarding goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	close(p.change)
	p.change = make(chan struct{})
	for k := range p.conns {
		k.close()
		delete(p.conns, k)
	}
	p.mu.Unlock()
	err := p.l.Close()
	p.wg.Wait()
	return err
}

// state returns the mode, the delay and a channel closed at the next change.
func (p *Proxy) state() (Mode, time.Duration, <-chan struct{}, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode, p.delay, p.change, p.closed
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	if m, _, _, closed := p.state(); m == Cut || closed {
		c.Close()
		return
	}
	s, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	k := &link{client: c, server: s}
	p.mu.Lock()
	if p.mode == Cut || p.closed {
		p.mu.Unlock()
		k.close()
		return
	}
	p.conns[k] = struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(k, s, c, false) }()
	go func() { defer wg.Done(); p.pipe(k, c, s, true) }()
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, k)
	p.mu.Unlock()
}

// pipe copies src to dst chunk by chunk, as the mode says, until either
// side ends; then it closes both. reply says src is the upstream.
func (p *Proxy) pipe(k *link, dst, src net.Conn, reply bool) {
	defer k.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && reply && p.lateReplies.Load() > 0 && p.lateReplies.Add(-1) >= 0 {
			time.Sleep(time.Duration(p.lateDelay.Load()))
		}
		if n > 0 && !p.forward(dst, buf[:n], reply) {
			return
		}
		if err != nil {
			return // EOF or a closed side: the link ends
		}
	}
}

// forward writes one chunk under the current mode; false means the link is
// finished. reply says the chunk comes from the upstream.
func (p *Proxy) forward(dst net.Conn, b []byte, reply bool) bool {
	for {
		m, delay, change, closed := p.state()
		if closed {
			return false
		}
		if m == SlowReplies && !reply {
			m = Pass // only the upstream's replies are slowed
		}
		switch m {
		case Pass:
			_, err := dst.Write(b)
			return err == nil
		case Delay, SlowReplies:
			t := time.NewTimer(delay)
			select {
			case <-t.C:
				_, err := dst.Write(b)
				return err == nil
			case <-change:
				t.Stop()
				// Re-evaluate under the new mode; a healed link sends now.
			}
		case Drop:
			return true // discarded
		case Freeze:
			<-change // hold until the mode changes
		case Cut:
			return false
		}
	}
}
