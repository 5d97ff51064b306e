package doortest

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/idemgate/idemgate"
)

// testFlushPassesThrough: a handler that flushes part of its answer
// sends it at once (the middleware keeps http.ResponseController's Flush
// working), and the whole answer is stored: the retry replays both parts.
func testFlushPassesThrough(t *testing.T, b bundle) {
	s := b.serve(t, nil, func(w http.ResponseWriter, _ *http.Request, _ int64) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "part1,")
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("Flush through the middleware: %v", err)
		}
		_, _ = io.WriteString(w, "part2")
	})
	rec := s.do(t, req{key: "k", body: imageBody})
	if !rec.Flushed || rec.Body.String() != "part1,part2" {
		t.Fatalf("flushed = %v, body %q; want a flush and part1,part2", rec.Flushed, rec.Body)
	}
	want{status: 200, calls: 1, replayed: true, body: "part1,part2"}.check(t, s, s.do(t, req{key: "k", body: imageBody}))
}

// testHijackIsNeverStored: on a real server a handler takes the
// connection over (http.ResponseController's Hijack works through the
// middleware); what it wrote there is not the middleware's to store, so
// the claim is released and each request runs the handler.
func testHijackIsNeverStored(t *testing.T, b bundle) {
	released := make(chan struct{}, 2)
	s := b.serve(t, func(c *Config) {
		record := c.OnEvent
		c.OnEvent = func(ctx context.Context, e idemgate.Event) {
			record(ctx, e)
			if e.Type == idemgate.EventReleased {
				released <- struct{}{}
			}
		}
	}, func(w http.ResponseWriter, _ *http.Request, _ int64) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("Hijack through the middleware: %v", err)
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer conn.Close()
		_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nhijacked")
		_ = buf.Flush()
	})
	srv := newServer(t, s.h)
	for i := range 2 {
		hr := req{key: "k", body: imageBody}.build(s)
		hr.RequestURI = ""
		hr.URL.Scheme, hr.URL.Host = "http", srv.Listener.Addr().String()
		resp, err := srv.Client().Do(hr)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "hijacked" {
			t.Errorf("request %d body = %q", i, body)
		}
		// The client has its answer before the middleware releases the
		// claim; the next request must not race the release.
		select {
		case <-released:
		case <-time.After(30 * time.Second):
			t.Fatalf("request %d: no released event within 30 s (events %s)", i, s.events.String())
		}
	}
	if got := s.events.String(); got != "claimed,released(hijacked),claimed,released(hijacked)" {
		t.Errorf("events = %s, want two claims, each released as hijacked", got)
	}
	if n := s.calls.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2 (a hijacked answer is never stored)", n)
	}
}
