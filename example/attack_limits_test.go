package main

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
)

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
