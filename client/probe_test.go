package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestProbeOSFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "b.json")
	os.WriteFile(path, []byte(`{"a":1}`), 0o600)
	f, _ := os.Open(path)
	defer f.Close()
	srv := newFakeServer(t, answer{drop: true}, problem(503, "x", ""), answer{status: 201})
	c := newTestClient(Config{BaseURL: srv.URL, Sleep: recordSleeps(new([]time.Duration))})
	_, err := c.Send(context.Background(), "POST", "/x", "k", f)
	keys, _, bodies, _ := srv.seen()
	t.Logf("err=%v keys=%q bodies=%q ctypes=%q", err, keys, bodies, srv.contentTypes())
}

func TestProbeCancelDuringRealWait(t *testing.T) {
	srv := newFakeServer(t, withHeader(problem(503, "store_unavailable", "true"), "Retry-After", "30"))
	ctx, cancel := context.WithCancel(context.Background())
	c := New(Config{BaseURL: srv.URL, OnRetry: func(int, time.Duration, error) { go func() { time.Sleep(50 * time.Millisecond); cancel() }() }})
	start := time.Now()
	_, err := c.Send(ctx, "POST", "/x", "k", nil)
	var p *Problem
	t.Logf("took %v err=%v canceled=%v problem=%v", time.Since(start), err, errors.Is(err, context.Canceled), errors.As(err, &p))
}

func TestProbeDeadlineJustShort(t *testing.T) {
	srv := newFakeServer(t, withHeader(problem(503, "store_unavailable", "true"), "Retry-After", "30"))
	ctx, cancel := context.WithTimeout(context.Background(), 29*time.Second)
	defer cancel()
	c := New(Config{BaseURL: srv.URL})
	start := time.Now()
	_, err := c.Send(ctx, "POST", "/x", "k", nil)
	var p *Problem
	t.Logf("took %v err=%v dl=%v problem=%v", time.Since(start), err, errors.Is(err, context.DeadlineExceeded), errors.As(err, &p))
}

func TestProbeCutAnswerRetried(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := make([]byte, 100)
		k, _ := r.Body.Read(b)
		mu.Lock()
		n++
		i := n
		seen = append(seen, r.Header.Get("Idempotency-Key")+" "+string(b[:k]))
		mu.Unlock()
		if i == 1 {
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(200)
			w.Write([]byte("short"))
			return
		}
		w.WriteHeader(201)
	}))
	defer srv.Close()
	c := newTestClient(Config{BaseURL: srv.URL, Sleep: recordSleeps(new([]time.Duration))})
	r, err := c.Send(context.Background(), "POST", "/x", "k", map[string]int{"a": 1})
	t.Logf("r=%v err=%v seen=%q", r, err, seen)
}

func TestProbeManyGoroutines(t *testing.T) {
	var mu sync.Mutex
	count := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		k := r.Header.Get("Idempotency-Key") + r.URL.Path
		count[k]++
		c := count[k]
		mu.Unlock()
		if c == 1 {
			w.Header().Set("Retry-After", "0.001")
			w.WriteHeader(503)
			return
		}
		if r.Method == "POST" {
			w.Header().Set("Location", "/v1/tasks/"+r.Header.Get("Idempotency-Key"))
			w.WriteHeader(202)
			return
		}
		w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	c := New(Config{BaseURL: srv.URL, MinBackoff: time.Millisecond, Header: http.Header{"X-A": {"b"}}})
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			r, err := c.Send(context.Background(), "POST", "/x", fmt.Sprint("k", i), map[string]int{"i": i})
			if err != nil {
				t.Error(err)
				return
			}
			_, err = c.Poll(context.Background(), r.Location(), r.RetryAfter(), func(*Response) (bool, error) { return true, nil })
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

func TestProbeLocation(t *testing.T) {
	for _, loc := range []string{"/api/v1/tasks/a%2Fb", "/api/v1/../../admin", "//evil.example/x", "http://u:p@HOST/x", "tasks/%2e%2e/x", "http:/x", "HTTP://HOST:80/x", "\\\\evil.example/x"} {
		srv := newFakeServer(t, answer{status: 202, header: map[string]string{"Location": strings.ReplaceAll(loc, "HOST", "127.0.0.1")}})
		c := newTestClient(Config{BaseURL: srv.URL + "/api", Sleep: recordSleeps(new([]time.Duration))})
		r, _ := c.Send(context.Background(), "POST", "/v1/p", "k", nil)
		_, err := c.resolve(r.Location())
		u, _ := c.resolve(r.Location())
		t.Logf("%q -> Location() %q -> resolve %q %v", loc, r.Location(), u, err)
	}
}

func TestProbeProblems(t *testing.T) {
	for _, body := range []string{
		`{"type":1,"title":[],"detail":{},"code":true,"changed":"x","status":"409"}`,
		`{"code":"key_reused","code":7}`,
		`{"code":7,"code":"key_reused"}`,
		`null`, `[]`, `"key_reused"`, `{"code":null}`, `{"changed":[1,"/a",null]}`,
		`{"code":"key_reused"` + strings.Repeat(" ", 1000) + `}`,
		`<html>502</html>`,
		"{\"code\":\"key_reused\",\"detail\":\"\xff\xfe\"}",
	} {
		srv := newFakeServer(t, answer{status: 409, body: body})
		c := newTestClient(Config{BaseURL: srv.URL, Sleep: recordSleeps(new([]time.Duration))})
		_, err := c.Send(context.Background(), "POST", "/x", "k", nil)
		var p *Problem
		errors.As(err, &p)
		t.Logf("%.60q -> %v keyReused=%v code=%q changed=%q", body, err, errors.Is(err, ErrKeyReused), p.Code, p.Changed)
	}
}

func TestProbeRetryAfterExtremes(t *testing.T) {
	for _, h := range [][2]string{{"Retry-After", "1e9"}, {"Retry-After-Ms", "1e30"}, {"Retry-After-Ms", "9223372036854775808"}, {"Retry-After", "-0"}, {"Retry-After", time.Now().Add(30 * time.Second).UTC().Format(http.TimeFormat)}, {"Retry-After", time.Now().Add(-30 * time.Second).UTC().Format(http.TimeFormat)}} {
		srv := newFakeServer(t, withHeader(problem(503, "x", "true"), h[0], h[1]), answer{status: 201})
		var waits []time.Duration
		c := New(Config{BaseURL: srv.URL, Sleep: recordSleeps(&waits)})
		_, err := c.Send(context.Background(), "POST", "/x", "k", nil)
		var p *Problem
		errors.As(err, &p)
		ra := time.Duration(0)
		if p != nil {
			ra = p.RetryAfter
		}
		t.Logf("%s: %s -> err=%v ra=%v waits=%v", h[0], h[1], err, ra, waits)
	}
}
