package main

import (
	"bufio"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// limitedServer serves a handler that reads the whole body and answers its
// length, under limits parsed from flags the way "serve" parses them. It
// returns the address and a counter of the bodies read in full.
func limitedServer(t *testing.T, args ...string) (string, *atomic.Int64) {
	t.Helper()
	var l serverLimits
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	l.addFlags(fs, func(string) string { return "" })
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if err := l.validate(); err != nil {
		t.Fatal(err)
	}
	var full atomic.Int64
	srv := l.server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		full.Add(1)
		io.WriteString(w, strconv.Itoa(len(b)))
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), &full
}

// TestSlowBodyCutOff: a body trickled slower than -read-timeout allows is
// cut off: the handler never gets it in full, and the server closes the
// connection while the client is still sending. The body is far longer
// than the test's patience at the trickle's pace, so the close is the
// server's doing however slow the machine; the bytes come a third of the
// read timeout apart, so a limit on each read alone would not cut it.
func TestSlowBodyCutOff(t *testing.T) {
	t.Parallel()
	addr, full := limitedServer(t, "-read-timeout", "300ms", "-read-header-timeout", "300ms")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const size = 1 << 20
	if _, err := io.WriteString(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: "+strconv.Itoa(size)+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		io.Copy(io.Discard, conn) // returns when the server closes
	}()
	const patience = time.Minute
	give := time.After(patience)
	sent := 0
trickle:
	for {
		if _, err := conn.Write([]byte{'x'}); err == nil {
			sent++
		}
		select {
		case <-closed:
			break trickle
		case <-give:
			t.Fatalf("the server still read a body trickled for %v (%d bytes, one per 100ms) under -read-timeout 300ms", patience, sent)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if n := full.Load(); n != 0 {
		t.Fatalf("the handler read %d trickled bodies in full", n)
	}
	t.Logf("server closed the connection after %d of %d body bytes", sent, size)
}

// TestSlowHeadersCutOff: headers trickled slower than -read-header-timeout
// allows never reach the handler.
func TestSlowHeadersCutOff(t *testing.T) {
	t.Parallel()
	addr, full := limitedServer(t, "-read-header-timeout", "200ms", "-read-timeout", "200ms")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	head := "GET / HTTP/1.1\r\nHost: x\r\n" + strings.Repeat("X-Pad: y\r\n", 100) + "\r\n"
	for i := 0; i < len(head); i++ {
		if _, err := conn.Write([]byte{head[i]}); err != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
		if i == len(head)-1 {
			// Every byte went through: the server must have answered an
			// error or closed, not served the request.
			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err == nil && resp.StatusCode == http.StatusOK {
				t.Fatalf("headers trickled over %v were served", time.Duration(len(head))*20*time.Millisecond)
			}
		}
	}
	if n := full.Load(); n != 0 {
		t.Fatalf("the handler ran %d times for trickled headers", n)
	}
}

// TestIdleConnectionClosed: a keep-alive connection left idle is closed by
// the server (-idle-timeout); without the limit it would live for ever.
func TestIdleConnectionClosed(t *testing.T) {
	t.Parallel()
	addr, _ := limitedServer(t, "-idle-timeout", "200ms")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "2" || resp.Close {
		t.Fatalf("first request = %d %q close=%v", resp.StatusCode, body, resp.Close)
	}
	// Idle now. The bound only keeps a broken test from hanging.
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = br.ReadByte()
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		t.Fatal("the idle connection was still open after 10s")
	case err == nil:
		t.Fatal("the server sent bytes on an idle connection")
	}
}

// TestServerLimitsFlags: the defaults, the environment, and refusal of a
// negative limit.
func TestServerLimitsFlags(t *testing.T) {
	t.Parallel()
	parse := func(env map[string]string, args ...string) (serverLimits, error) {
		var l serverLimits
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		l.addFlags(fs, func(k string) string { return env[k] })
		if err := fs.Parse(args); err != nil {
			return l, err
		}
		return l, l.validate()
	}
	l, err := parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := l.server(http.NotFoundHandler())
	if srv.ReadHeaderTimeout != 5*time.Second || srv.ReadTimeout != 10*time.Second ||
		srv.WriteTimeout != 30*time.Second || srv.IdleTimeout != 60*time.Second {
		t.Errorf("defaults = %v %v %v %v", srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout)
	}
	l, err = parse(map[string]string{"READ_TIMEOUT": "3s", "IDLE_TIMEOUT": "7s"}, "-idle-timeout", "9s")
	if err != nil {
		t.Fatal(err)
	}
	if srv := l.server(nil); srv.ReadTimeout != 3*time.Second || srv.IdleTimeout != 9*time.Second {
		t.Errorf("env READ_TIMEOUT=3s and -idle-timeout 9s over IDLE_TIMEOUT=7s: read %v idle %v", srv.ReadTimeout, srv.IdleTimeout)
	}
	if _, err := parse(nil, "-write-timeout", "-1s"); err == nil {
		t.Error("a negative -write-timeout was accepted")
	}
	// A zero-valued serverLimits (settings built in code, e.g. the demo)
	// still gets every limit.
	if srv := (serverLimits{}).server(nil); srv.ReadTimeout == 0 || srv.WriteTimeout == 0 || srv.IdleTimeout == 0 || srv.ReadHeaderTimeout == 0 {
		t.Errorf("zero serverLimits left a limit off: %v %v %v %v", srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout)
	}
}

// TestHeaderFlood: a request with 512 KiB of headers (net/http's default
// limit is 1 MiB) is answered 431 and never reaches the handler; ordinary
// headers, a long bearer token included, still pass. -max-header-bytes
// raises the limit.
func TestHeaderFlood(t *testing.T) {
	t.Parallel()
	send := func(addr string, headerBytes int) int {
		t.Helper()
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		var b strings.Builder
		b.WriteString("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nAuthorization: Bearer " + strings.Repeat("t", 2048) + "\r\n")
		for i := 0; b.Len() < headerBytes; i++ {
			b.WriteString("X-Flood: " + strings.Repeat("f", 1000) + "\r\n")
		}
		b.WriteString("\r\n")
		go conn.Write([]byte(b.String()))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%d bytes of headers: %v", headerBytes, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	addr, full := limitedServer(t)
	if code := send(addr, 4<<10); code != http.StatusOK {
		t.Fatalf("4 KiB of headers = %d, want 200", code)
	}
	if code := send(addr, 512<<10); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("512 KiB of headers = %d, want 431", code)
	}
	if n := full.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once (for the small headers)", n)
	}
	raised, _ := limitedServer(t, "-max-header-bytes", "1048576")
	if code := send(raised, 512<<10); code != http.StatusOK {
		t.Errorf("512 KiB of headers under -max-header-bytes 1048576 = %d, want 200", code)
	}
}
