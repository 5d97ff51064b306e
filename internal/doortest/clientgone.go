package doortest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testClientGoneBeforeTheClaim: a client gone before its claim is no
// store outage: the handler does not run, the claim is given back
// (released, reason canceled), and the client's retry runs at once.
func testClientGoneBeforeTheClaim(t *testing.T, b bundle) {
	s := b.serve(t, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, p := s.try(s.h, req{key: "k", body: imageBody}.build(s).WithContext(ctx)); p != nil {
		t.Fatalf("the server panicked with %v", p)
	}
	if got := s.events.String(); got != "released(canceled)" {
		t.Errorf("events = %q, want released(canceled)", got)
	}
	if n := s.calls.Load(); n != 0 {
		t.Errorf("handler ran %d times for a client that was gone", n)
	}
	want{status: 201, calls: 1}.check(t, s, s.do(t, req{key: "k", body: imageBody}))
}

// testAnswerAfterTheContextEnded: the request's context ends while the
// handler runs (the client went away) and the handler answers all the
// same: the answer is stored, and the retry replays it.
func testAnswerAfterTheContextEnded(t *testing.T, b bundle) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := b.serve(t, nil, func(w http.ResponseWriter, r *http.Request, n int64) {
		cancel()
		defaultHandler(w, r, n)
	})
	if _, p := s.try(s.h, req{key: "k", body: imageBody}.build(s).WithContext(ctx)); p != nil {
		t.Fatalf("the server panicked with %v", p)
	}
	want{status: 201, calls: 1, replayed: true, body: `{"run":1,"got":` + imageBody + `}`}.check(t, s, s.do(t, req{key: "k", body: imageBody}))
}

// failedWrites wraps the server's ResponseWriter, outside the door, and
// counts the writes to the connection that failed: the proof that the
// client really was gone when the handler wrote.
type failedWrites struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (w failedWrites) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	if err != nil {
		w.n.Add(1)
	}
	return n, err
}

func (w failedWrites) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// testClientLeftTheConnection: on a real server the client gives up while
// the handler runs, then the handler writes 512 KiB, more than the
// socket buffers hold, and the writes to the connection fail. The answer
// the handler produced in full is stored all the same: the retry replays
// it, and the handler ran once.
func testClientLeftTheConnection(t *testing.T, b bundle) {
	const size = 512 << 10
	payload := bytes.Repeat([]byte{'x'}, size)
	entered := make(chan struct{}, 1)
	s := b.serve(t, nil, func(w http.ResponseWriter, r *http.Request, n int64) {
		if n == 1 {
			entered <- struct{}{}
			<-r.Context().Done()
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(payload)
	})
	var failed atomic.Int64
	var served sync.WaitGroup
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer served.Done()
		s.h.ServeHTTP(failedWrites{w, &failed}, r)
	}))
	send := func(ctx context.Context) (*http.Response, error) {
		r := req{key: "k", body: imageBody}.build(s)
		r.RequestURI = ""
		r.URL.Scheme, r.URL.Host = "http", srv.Listener.Addr().String()
		return srv.Client().Do(r.WithContext(ctx))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served.Add(1)
	errc := make(chan error, 1)
	go func() {
		resp, err := send(ctx)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not start within 30 s")
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("first request: err = %v, want the client to give up", err)
	}
	served.Wait()
	if failed.Load() == 0 {
		t.Fatal("no write to the gone client failed: the case proves nothing")
	}
	served.Add(1)
	resp, err := send(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	served.Wait()
	if n := s.calls.Load(); n != 1 || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("handler ran %d times, retry replayed %q; want once and a replay", n, resp.Header.Get("Idempotent-Replayed"))
	}
	if resp.StatusCode != http.StatusCreated || !bytes.Equal(body, payload) {
		t.Errorf("retry = %d with %d bytes, want 201 with the %d bytes the handler wrote", resp.StatusCode, len(body), size)
	}
}
