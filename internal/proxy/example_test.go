package proxy_test

import (
	"fmt"
	"net"
	"time"

	"github.com/idemgate/idemgate/internal/proxy"
)

// A proxy between a client and a server cuts the link and heals it again.
func Example() {
	// A server that greets every connection.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello\n"))
			c.Close()
		}
	}()

	p, _ := proxy.Start(l.Addr().String())
	defer p.Close()
	greet := func() string {
		c, err := net.Dial("tcp", p.Addr)
		if err != nil {
			return "dial: " + err.Error()
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 16)
		n, err := c.Read(buf)
		if err != nil {
			return "no answer"
		}
		return string(buf[:n-1])
	}

	fmt.Println(greet())
	p.Set(proxy.Cut, 0)
	fmt.Println(p.Mode(), greet())
	p.Heal()
	fmt.Println(p.Mode(), greet())
	// Output:
	// hello
	// cut no answer
	// pass hello
}
