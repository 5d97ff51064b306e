package pgstore

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// tcpProxy forwards TCP connections to a server until it is frozen: then
// it holds every byte in both directions, and accepts new connections
// without forwarding anything, as a network partition does. The
// connections stay open (no reset), so their peers see only silence.
type tcpProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	thawed chan struct{} // closed while traffic flows
	conns  []net.Conn
	closed bool
}

func startProxy(t testing.TB, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target, thawed: make(chan struct{})}
	close(p.thawed)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *tcpProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.forward(c)
	}
}

func (p *tcpProxy) forward(client net.Conn) {
	p.gate()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(client, server) {
		return
	}
	go p.pipe(server, client)
	p.pipe(client, server)
}

// track records conns so that close can end them; false when closed.
func (p *tcpProxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	p.conns = append(p.conns, conns...)
	return true
}

// pipe copies src to dst, holding each chunk while the proxy is frozen.
func (p *tcpProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.gate()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
			}
			return
		}
	}
}

// gate waits while the proxy is frozen.
func (p *tcpProxy) gate() {
	p.mu.Lock()
	ch := p.thawed
	p.mu.Unlock()
	<-ch
}

// freeze stops all traffic; thaw lets it flow again.
func (p *tcpProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.thawed:
		p.thawed = make(chan struct{})
	default:
	}
}

func (p *tcpProxy) thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.thawed:
	default:
		close(p.thawed)
	}
}

func (p *tcpProxy) close() {
	p.thaw()
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, c := range p.conns {
		c.Close()
	}
}

// poolVia opens a pool on db whose connections all go through a new proxy.
func (d testDB) poolVia(t testing.TB) (*pgxpool.Pool, *tcpProxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	addr := p.ln.Addr().(*net.TCPAddr)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = addr.IP.String(), uint16(addr.Port)
	cfg.ConnConfig.Fallbacks = nil
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	t.Cleanup(p.thaw) // first: a frozen pool could not close
	return pool, p
}
