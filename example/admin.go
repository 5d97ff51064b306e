package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// admin is the admin listener: /metrics, apart from the API so that it can
// stay on loopback or a private network.
type admin struct {
	ln  net.Listener
	srv *http.Server
}

// startAdmin serves o's metrics on s.adminAddr. A busy default port is a
// warning (several example processes on one machine), an explicitly
// configured one an error. A nil admin means "not serving".
func startAdmin(s obsSettings, o *observer, stderr io.Writer) (*admin, error) {
	if o == nil || s.adminAddr == "" || s.adminAddr == "off" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", s.adminAddr)
	if err != nil {
		if s.adminExplicit {
			return nil, fmt.Errorf("admin listener: %w", err)
		}
		fmt.Fprintf(stderr, "WARNING: admin listener %s: %v; /metrics is off (set -admin-addr or ADMIN_ADDR)\n", s.adminAddr, err)
		return nil, nil
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", o.metrics)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "idemgate example admin listener: GET /metrics (Prometheus text)")
	})
	a := &admin{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}
	go func() {
		if err := a.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(stderr, "admin listener: %v\n", err)
		}
	}()
	return a, nil
}

// url is where the admin listener can be reached from this machine, or "".
func (a *admin) url() string {
	if a == nil {
		return ""
	}
	tcp := a.ln.Addr().(*net.TCPAddr)
	host := tcp.IP.String()
	if tcp.IP.IsUnspecified() {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, fmt.Sprint(tcp.Port))
}

// close stops the admin listener.
func (a *admin) close(ctx context.Context) error {
	if a == nil {
		return nil
	}
	return a.srv.Shutdown(ctx)
}

// printObs adds the page, metrics and traces lines to the startup output.
func printObs(w io.Writer, apiURL string, a *admin, o *observer) {
	fmt.Fprintf(w, "  page:     %s/ (sign in as a dev tenant and user, generate, retry, reword)\n", apiURL)
	printAdmin(w, a)
	if o != nil {
		fmt.Fprintf(w, "  traces:   %s\n", o.traceOut)
	}
}

// printAdmin adds the metrics line to a worker's startup output.
func printAdmin(w io.Writer, a *admin) {
	if u := a.url(); u != "" {
		fmt.Fprintf(w, "  metrics:  %s/metrics\n", u)
	}
}
