package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// answer is one scripted server response; drop closes the connection
// after reading the request instead of answering (a lost response).
type answer struct {
	drop   bool
	status int
	header map[string]string
	body   string
}

// fakeServer answers requests from a script and records what it saw.
type fakeServer struct {
	mu     sync.Mutex
	script []answer
	keys   []string // Idempotency-Key of every request
	paths  []string // "METHOD path" of every request
	bodies []string
	auth   []string
	ctypes []string // Content-Type of every request
	*httptest.Server
}

func newFakeServer(t *testing.T, script ...answer) *fakeServer {
	t.Helper()
	f := &fakeServer{script: script}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.keys = append(f.keys, r.Header.Get("Idempotency-Key"))
		f.paths = append(f.paths, r.Method+" "+r.URL.Path)
		f.bodies = append(f.bodies, string(body))
		f.auth = append(f.auth, r.Header.Get("Authorization"))
		f.ctypes = append(f.ctypes, r.Header.Get("Content-Type"))
		if len(f.script) == 0 {
			f.mu.Unlock()
			t.Errorf("unexpected request %s %s", r.Method, r.URL.Path)
			w.WriteHeader(http.StatusTeapot)
			return
		}
		a := f.script[0]
		f.script = f.script[1:]
		f.mu.Unlock()
		if a.drop {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		for k, v := range a.header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(a.status)
		io.WriteString(w, a.body)
	}))
	t.Cleanup(f.Close)
	return f
}

// seen returns what every request so far carried.
func (f *fakeServer) seen() (keys, paths, bodies, auth []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.keys), slices.Clone(f.paths), slices.Clone(f.bodies), slices.Clone(f.auth)
}

// contentTypes returns the Content-Type every request so far carried.
func (f *fakeServer) contentTypes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ctypes)
}

// newTestClient is New with the jitter drawn as 0, so that waits are the
// policy's bounds exactly (the backoff itself; Retry-After itself).
func newTestClient(cfg Config) *Client {
	c := New(cfg)
	c.randN = func(int64) int64 { return 0 }
	return c
}

// recordSleeps returns a Sleep that records waits instead of waiting.
func recordSleeps(waits *[]time.Duration) func(context.Context, time.Duration) error {
	var mu sync.Mutex
	return func(ctx context.Context, d time.Duration) error {
		mu.Lock()
		*waits = append(*waits, d)
		mu.Unlock()
		return ctx.Err()
	}
}

// problem is an idemgate-shaped problem answer; shouldRetry "" sends no
// x-should-retry header.
func problem(status int, code, shouldRetry string) answer {
	b, _ := json.Marshal(map[string]any{"type": "about:blank", "title": http.StatusText(status), "status": status, "code": code})
	h := map[string]string{"Content-Type": "application/problem+json"}
	if shouldRetry != "" {
		h["X-Should-Retry"] = shouldRetry
	}
	return answer{status: status, header: h, body: string(b)}
}

func withHeader(a answer, k, v string) answer {
	h := map[string]string{k: v}
	for k, v := range a.header {
		h[k] = v
	}
	a.header = h
	return a
}

var errAny = errors.New("any error")

func TestSend(t *testing.T) {
	t.Parallel()
	accepted := answer{status: 202, header: map[string]string{"Location": "/v1/tasks/t1", "Retry-After": "1"}, body: `{"task_id":"t1"}`}
	replayed := withHeader(accepted, "Idempotent-Replayed", "true")
	tests := []struct {
		name         string
		given        []answer
		wantErr      error // nil: success; errAny: any error; ErrKeyReused; &Problem{}: a *Problem
		wantAttempts int
		wantWaits    []time.Duration
		wantReplayed bool
	}{
		{name: "first try", given: []answer{accepted}, wantAttempts: 1},
		{name: "lost response is retried with the same id and replays", given: []answer{{drop: true}, replayed},
			wantAttempts: 2, wantWaits: []time.Duration{100 * time.Millisecond}, wantReplayed: true},
		{name: "key_reused is never retried", given: []answer{problem(409, "key_reused", "false")},
			wantErr: ErrKeyReused, wantAttempts: 1},
		{name: "key_reused is never retried, even if a proxy says so", given: []answer{problem(409, "key_reused", "true")},
			wantErr: ErrKeyReused, wantAttempts: 1},
		{name: "in progress waits Retry-After then retries", given: []answer{withHeader(problem(409, "request_in_progress", "true"), "Retry-After", "2"), replayed},
			wantAttempts: 2, wantWaits: []time.Duration{2 * time.Second}, wantReplayed: true},
		{name: "5xx backs off exponentially", given: []answer{problem(503, "store_unavailable", ""), problem(502, "", ""), accepted},
			wantAttempts: 3, wantWaits: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}},
		{name: "x-should-retry false beats a 503", given: []answer{problem(503, "upstream_down", "false")},
			wantErr: &Problem{}, wantAttempts: 1},
		{name: "x-should-retry true beats a 400", given: []answer{problem(400, "try_again", "true"), accepted},
			wantAttempts: 2, wantWaits: []time.Duration{100 * time.Millisecond}},
		{name: "400 is final", given: []answer{problem(400, "body_invalid", "")}, wantErr: &Problem{}, wantAttempts: 1},
		{name: "a 409 of another kind is final", given: []answer{problem(409, "conflict", "")}, wantErr: &Problem{}, wantAttempts: 1},
		{name: "429 is retried", given: []answer{withHeader(problem(429, "", ""), "Retry-After", "3"), accepted},
			wantAttempts: 2, wantWaits: []time.Duration{3 * time.Second}},
		{name: "gives up after MaxAttempts", given: []answer{{drop: true}, {drop: true}, {drop: true}},
			wantErr: errAny, wantAttempts: 3, wantWaits: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, tt.given...)
			var waits []time.Duration
			c := newTestClient(Config{BaseURL: srv.URL + "/", Header: http.Header{"Authorization": {"Bearer tok"}}, MaxAttempts: 3, Sleep: recordSleeps(&waits)})
			params := map[string]any{"amount": 10, "currency": "EUR"}
			id := RequestID("invoice:7:pay", params)

			r, err := c.Send(context.Background(), http.MethodPost, "/v1/payments", id, params)

			switch {
			case tt.wantErr == nil && err != nil:
				t.Fatalf("Send: %v", err)
			case tt.wantErr != nil && err == nil:
				t.Fatalf("Send succeeded, want an error")
			case tt.wantErr == ErrKeyReused && !errors.Is(err, ErrKeyReused):
				t.Fatalf("err = %v, want ErrKeyReused", err)
			case tt.wantErr != ErrKeyReused && errors.Is(err, ErrKeyReused):
				t.Fatalf("err = %v matches ErrKeyReused", err)
			}
			if _, ok := tt.wantErr.(*Problem); ok {
				var p *Problem
				if !errors.As(err, &p) || p.Status != tt.given[len(tt.given)-1].status {
					t.Fatalf("err = %T %v, want the last answer's *Problem", err, err)
				}
			}
			keys, paths, bodies, auth := srv.seen()
			if len(keys) != tt.wantAttempts {
				t.Fatalf("server saw %d requests, want %d", len(keys), tt.wantAttempts)
			}
			for i := range keys {
				if keys[i] != id || paths[i] != "POST /v1/payments" || bodies[i] != bodies[0] || auth[i] != "Bearer tok" {
					t.Errorf("attempt %d sent key %q to %s with body %s and auth %q; want key %q, the same body and auth",
						i+1, keys[i], paths[i], bodies[i], auth[i], id)
				}
			}
			if !slices.Equal(waits, tt.wantWaits) {
				t.Errorf("waits = %v, want %v", waits, tt.wantWaits)
			}
			if err == nil {
				if r.Status != 202 || r.Header.Get("Location") != "/v1/tasks/t1" || r.Replayed != tt.wantReplayed ||
					r.Attempts != tt.wantAttempts || r.RetryAfter() != time.Second {
					t.Errorf("response = %+v", r)
				}
			}
		})
	}
}

// TestSendRefusesAnUnsendableRequestID: an id no Idempotency-Key can carry
// never reaches the server (it would answer key_invalid every time).
func TestSendRefusesAnUnsendableRequestID(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, given string }{
		{name: "empty", given: ""},
		{name: "not ASCII", given: "invoice:7:zahlung-für-März"},
		{name: "a control character", given: "invoice:7\n"},
		{name: "over 255 bytes", given: strings.Repeat("k", 256)},
	}
	srv := newFakeServer(t)
	c := New(Config{BaseURL: srv.URL})
	for _, tt := range tests {
		if _, err := c.Send(context.Background(), http.MethodPost, "/v1/payments", tt.given, nil); err == nil {
			t.Errorf("%s: Send succeeded", tt.name)
		}
	}
	if keys, _, _, _ := srv.seen(); len(keys) != 0 {
		t.Errorf("the server saw %d requests, want none", len(keys))
	}
}

// TestConfigHeaderIsCopied: a caller that reuses its header map after New
// changes nothing the client sends.
func TestConfigHeaderIsCopied(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, answer{status: 201})
	h := http.Header{"Authorization": {"Bearer tok"}}
	c := New(Config{BaseURL: srv.URL, Header: h})
	h.Set("Authorization", "Bearer other")
	if _, err := c.Send(context.Background(), http.MethodPost, "/x", "k", nil); err != nil {
		t.Fatal(err)
	}
	if _, _, _, auth := srv.seen(); auth[0] != "Bearer tok" {
		t.Errorf("Authorization = %q, want the one given to New", auth[0])
	}
}

func TestSendBody(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		given    any
		want     string
		wantType string
	}{
		{name: "value as JSON", given: map[string]int{"n": 1}, want: `{"n":1}`, wantType: "application/json"},
		{name: "bytes as they are", given: []byte(`{"n": 1}`), want: `{"n": 1}`, wantType: "application/json"},
		{name: "a reader's bytes as they are", given: strings.NewReader(`{"n": 1}`), want: `{"n": 1}`, wantType: "application/json"},
		{name: "nil sends none", given: nil, want: ``},
		{name: "nil bytes send none, and no content type", given: []byte(nil), want: ``},
		{name: "empty bytes send none, and no content type", given: []byte{}, want: ``},
		{name: "an empty reader sends none, and no content type", given: strings.NewReader(""), want: ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, answer{status: 201})
			c := New(Config{BaseURL: srv.URL})
			if _, err := c.Send(context.Background(), http.MethodPost, "/x", "k", tt.given); err != nil {
				t.Fatal(err)
			}
			if _, _, bodies, _ := srv.seen(); bodies[0] != tt.want {
				t.Errorf("body = %q, want %q", bodies[0], tt.want)
			}
			if ct := srv.contentTypes()[0]; ct != tt.wantType {
				t.Errorf("Content-Type = %q, want %q", ct, tt.wantType)
			}
		})
	}
}

func TestPoll(t *testing.T) {
	t.Parallel()
	running := func(retryAfter string) answer {
		a := answer{status: 200, body: `{"status":"running"}`}
		if retryAfter != "" {
			a.header = map[string]string{"Retry-After": retryAfter}
		}
		return a
	}
	succeeded := answer{status: 200, body: `{"status":"succeeded"}`}
	tests := []struct {
		name      string
		given     []answer
		wantErr   bool
		wantWaits []time.Duration
	}{
		{name: "polls until done, honouring Retry-After and backing off without it",
			given:     []answer{running("2"), running(""), running(""), succeeded},
			wantWaits: []time.Duration{time.Second, 2 * time.Second, 200 * time.Millisecond, 400 * time.Millisecond}},
		{name: "a transport error while polling is retried",
			given:     []answer{{drop: true}, succeeded},
			wantWaits: []time.Duration{time.Second, 100 * time.Millisecond}},
		{name: "a 404 ends the poll",
			given: []answer{problem(404, "not_found", "false")}, wantErr: true, wantWaits: []time.Duration{time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, tt.given...)
			var waits []time.Duration
			c := newTestClient(Config{BaseURL: srv.URL, Sleep: recordSleeps(&waits)})

			r, err := c.Poll(context.Background(), "/v1/tasks/t1", time.Second, func(r *Response) (bool, error) {
				var v struct{ Status string }
				err := r.Decode(&v)
				return v.Status == "succeeded", err
			})

			if (err != nil) != tt.wantErr {
				t.Fatalf("Poll: %v", err)
			}
			if err == nil && string(r.Body) != succeeded.body {
				t.Errorf("last answer = %s", r.Body)
			}
			keys, paths, _, _ := srv.seen()
			for i := range paths {
				if paths[i] != "GET /v1/tasks/t1" || keys[i] != "" {
					t.Errorf("request %d = %s with key %q, want GET /v1/tasks/t1 with none", i, paths[i], keys[i])
				}
			}
			if !slices.Equal(waits, tt.wantWaits) {
				t.Errorf("waits = %v, want %v", waits, tt.wantWaits)
			}
		})
	}
}

func TestPollStopsWithTheContext(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, answer{status: 200, body: `{}`})
	ctx, cancel := context.WithCancel(context.Background())
	c := New(Config{BaseURL: srv.URL, Sleep: func(ctx context.Context, d time.Duration) error {
		cancel()
		return ctx.Err()
	}})
	_, err := c.Poll(ctx, "/v1/tasks/t1", 0, func(*Response) (bool, error) { return false, nil })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Poll = %v, want context.Canceled", err)
	}
}

func TestRequestID(t *testing.T) {
	t.Parallel()
	type order struct {
		Amount   int    `json:"amount"`
		Currency string `json:"currency"`
	}
	base := RequestID("invoice:7:pay", order{10, "EUR"})
	tests := []struct {
		name     string
		given    string
		wantSame bool
	}{
		{name: "same action and parameters", given: RequestID("invoice:7:pay", order{10, "EUR"}), wantSame: true},
		{name: "changed amount", given: RequestID("invoice:7:pay", order{11, "EUR"})},
		{name: "changed currency", given: RequestID("invoice:7:pay", order{10, "USD"})},
		{name: "another action", given: RequestID("invoice:8:pay", order{10, "EUR"})},
		{name: "parameters split differently", given: RequestID("invoice:7:pay", 10, "EUR")},
	}
	for _, tt := range tests {
		if (tt.given == base) != tt.wantSame {
			t.Errorf("%s: RequestID = %q, base %q; same = %v, want %v", tt.name, tt.given, base, tt.given == base, tt.wantSame)
		}
	}
	if !strings.HasPrefix(base, "invoice:7:pay:") {
		t.Errorf("RequestID = %q, want it to start with the action", base)
	}
}

func TestKeyHeader(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, given, want string }{
		{name: "token stays bare", given: "poster:launch:1", want: "poster:launch:1"},
		{name: "space needs an sf-string", given: "close order 7", want: `"close order 7"`},
		{name: "quotes and backslashes are escaped", given: `a "b\c`, want: `"a \"b\\c"`},
		{name: "quotes inside a token stay bare", given: `a"b`, want: `a"b`},
		{name: "leading quote", given: `"x`, want: `"\"x"`},
	}
	for _, tt := range tests {
		if got := keyHeader(tt.given); got != tt.want {
			t.Errorf("%s: keyHeader(%q) = %s, want %s", tt.name, tt.given, got, tt.want)
		}
	}
}

// FuzzKeyHeader checks that every printable request id is sent as a header
// value the server parses back to the same id: a bare token, or an
// sf-string whose unescaping gives the id.
func FuzzKeyHeader(f *testing.F) {
	for _, s := range []string{"poster:launch:1", "a b", `"x`, `a\b"c`, " ", "~"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		for i := 0; i < len(id); i++ {
			if id[i] < 0x20 || id[i] > 0x7e {
				t.Skip("request ids are printable ASCII")
			}
		}
		if id == "" {
			t.Skip()
		}
		h := keyHeader(id)
		if h[0] != '"' {
			if h != id || strings.ContainsAny(h, " ") {
				t.Fatalf("bare %q for id %q", h, id)
			}
			return
		}
		if len(h) < 2 || h[len(h)-1] != '"' {
			t.Fatalf("unterminated sf-string %q", h)
		}
		var got strings.Builder
		for i := 1; i < len(h)-1; i++ {
			c := h[i]
			if c == '"' {
				t.Fatalf("unescaped quote in %q", h)
			}
			if c == '\\' {
				i++
				if i >= len(h)-1 || (h[i] != '"' && h[i] != '\\') {
					t.Fatalf("bad escape in %q", h)
				}
				c = h[i]
			}
			got.WriteByte(c)
		}
		if got.String() != id {
			t.Fatalf("sf-string %q unescapes to %q, want %q", h, got.String(), id)
		}
	})
}

// TestConcurrentSends: one Client shared by goroutines, each with its own
// request id, as a service would use it.
func TestConcurrentSends(t *testing.T) {
	t.Parallel()
	script := make([]answer, 16)
	for i := range script {
		script[i] = answer{status: 201}
	}
	srv := newFakeServer(t, script...)
	c := New(Config{BaseURL: srv.URL, Header: http.Header{"Authorization": {"Bearer tok"}}})
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			if _, err := c.Send(context.Background(), http.MethodPost, "/x", RequestID("a", i), i); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	keys, _, _, auth := srv.seen()
	if len(slices.Compact(slices.Sorted(slices.Values(keys)))) != 16 || slices.Contains(auth, "") {
		t.Errorf("keys = %v, auth = %v; want 16 distinct keys, all authorized", keys, auth)
	}
}

// TestPollFollowsLocation: a 202's Location, absolute, relative to the
// request's path or rooted, is read on the URL it names once resolved
// against the URL of the request that got it (BaseURL with a path prefix
// included).
func TestPollFollowsLocation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		given    func(srvURL string) string // the Location header
		wantPath string
	}{
		{name: "absolute URL", given: func(u string) string { return u + "/api/v1/tasks/t1" }, wantPath: "/api/v1/tasks/t1"},
		{name: "relative to the request's path", given: func(string) string { return "tasks/t1" }, wantPath: "/api/v1/tasks/t1"},
		{name: "relative, up a level", given: func(string) string { return "../v2/tasks/t1" }, wantPath: "/api/v2/tasks/t1"},
		{name: "rooted path", given: func(string) string { return "/api/v1/tasks/t1" }, wantPath: "/api/v1/tasks/t1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var seen []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				seen = append(seen, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
				mu.Unlock()
				if r.Method == http.MethodPost {
					w.Header().Set("Location", tt.given("http://"+r.Host))
					w.WriteHeader(http.StatusAccepted)
					return
				}
				io.WriteString(w, `{"status":"succeeded"}`)
			}))
			t.Cleanup(srv.Close)
			c := newTestClient(Config{BaseURL: srv.URL + "/api", Header: http.Header{"Authorization": {"Bearer tok"}}, Sleep: recordSleeps(new([]time.Duration))})

			r, err := c.Send(context.Background(), http.MethodPost, "/v1/payments", "k", nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Poll(context.Background(), r.Location(), 0, func(*Response) (bool, error) { return true, nil })
			if err != nil {
				t.Fatalf("Poll(%q): %v", r.Location(), err)
			}
			mu.Lock()
			defer mu.Unlock()
			want := []string{"POST /api/v1/payments Bearer tok", "GET " + tt.wantPath + " Bearer tok"}
			if !slices.Equal(seen, want) {
				t.Errorf("the server saw %q, want %q", seen, want)
			}
		})
	}
}

// TestPollRefusesAnotherOrigin: a Location on another origin is never
// read: the request would carry Config.Header (the caller's credentials)
// to a host the caller did not name.
func TestPollRefusesAnotherOrigin(t *testing.T) {
	t.Parallel()
	other := newFakeServer(t)
	srv := newFakeServer(t, answer{status: 202, header: map[string]string{"Location": other.URL + "/v1/tasks/t1"}})
	c := newTestClient(Config{BaseURL: srv.URL, Header: http.Header{"Authorization": {"Bearer tok"}}, Sleep: recordSleeps(new([]time.Duration))})

	r, err := c.Send(context.Background(), http.MethodPost, "/v1/payments", "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Poll(context.Background(), r.Location(), 0, func(*Response) (bool, error) { return true, nil })
	if err == nil || !strings.Contains(err.Error(), "origin") {
		t.Fatalf("Poll(%q) = %v, want a refusal naming the origin", r.Location(), err)
	}
	if keys, _, _, _ := other.seen(); len(keys) != 0 {
		t.Errorf("the other origin saw %d requests, want none", len(keys))
	}
}

// TestPollHasItsOwnBound: Poll ends after PollTimeout (default 10 minutes)
// with an error matching context.DeadlineExceeded, even with a context
// that never ends and a task that never finishes; it does not start a wait
// that would outlast the bound.
func TestPollHasItsOwnBound(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		given     time.Duration // PollTimeout
		wantTotal time.Duration // the most a Poll may wait in all
	}{
		{name: "default", given: 0, wantTotal: 10 * time.Minute},
		{name: "configured", given: 2 * time.Minute, wantTotal: 2 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			reads := 0
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				reads++
				mu.Unlock()
				w.Header().Set("Retry-After", "45")
				io.WriteString(w, `{"status":"running"}`)
			}))
			t.Cleanup(srv.Close)
			// Years before any real deadline, so that only PollTimeout, counted
			// on this clock, can end the Poll.
			clock := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
			sleeps := 0
			c := newTestClient(Config{BaseURL: srv.URL, PollTimeout: tt.given, Sleep: func(ctx context.Context, d time.Duration) error {
				sleeps++
				if sleeps > 1000 {
					return errors.New("still polling after 1000 waits")
				}
				clock = clock.Add(d)
				return ctx.Err()
			}})
			c.now = func() time.Time { return clock }
			start := clock

			_, err := c.Poll(context.Background(), "/v1/tasks/t1", time.Second, func(*Response) (bool, error) { return false, nil })

			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Poll = %v after %d waits, want context.DeadlineExceeded", err, sleeps)
			}
			if waited := clock.Sub(start); waited > tt.wantTotal || waited < tt.wantTotal-45*time.Second {
				t.Errorf("Poll waited %v in all, want at most %v and no more than one wait short of it", waited, tt.wantTotal)
			}
			mu.Lock()
			defer mu.Unlock()
			if reads != sleeps {
				t.Errorf("%d reads after %d waits, want a read after every wait", reads, sleeps)
			}
		})
	}
}

// TestSendRefusesAnOversizedAnswer: a 2xx answer over the limit (64 MiB) is an error
// matching ErrAnswerTooLarge, never a success with a body cut short; it is
// not retried (the action went through).
func TestSendRefusesAnOversizedAnswer(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, answer{status: 200, body: strings.Repeat("x", 1<<20+1)})
	c := newTestClient(Config{BaseURL: srv.URL, Sleep: recordSleeps(new([]time.Duration))})
	c.maxAnswer = 1 << 20 // 64 MiB in use; 1 MiB keeps the test light

	r, err := c.Send(context.Background(), http.MethodPost, "/v1/exports", "k", nil)

	if !errors.Is(err, ErrAnswerTooLarge) {
		n := 0
		if r != nil {
			n = len(r.Body)
		}
		t.Fatalf("Send = %v with a body of %d bytes, want ErrAnswerTooLarge", err, n)
	}
	if keys, _, _, _ := srv.seen(); len(keys) != 1 {
		t.Errorf("the server saw %d requests, want 1", len(keys))
	}
}

// TestGetTakesAnAnswerOfExactlyTheLimit: the limit is inclusive.
func TestGetTakesAnAnswerOfExactlyTheLimit(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, answer{status: 200, body: strings.Repeat("x", 1<<20)})
	c := New(Config{BaseURL: srv.URL})
	c.maxAnswer = 1 << 20
	r, err := c.Get(context.Background(), "/v1/exports/e1")
	if err != nil || len(r.Body) != c.maxAnswer {
		t.Fatalf("Get = %v, want the whole %d bytes", err, c.maxAnswer)
	}
}

// TestGetRefusesATargetOffTheAPI: Get (and Send) take a path under BaseURL
// or an absolute URL on its origin, nothing else: a relative reference has no
// base to resolve against (Response.Location is the way), and another
// origin would receive Config.Header.
func TestGetRefusesATargetOffTheAPI(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t)
	c := New(Config{BaseURL: srv.URL + "/api", Header: http.Header{"Authorization": {"Bearer tok"}}})
	host := strings.TrimPrefix(srv.URL, "http://")
	tests := []struct{ name, given string }{
		{name: "relative reference", given: "tasks/t1"},
		{name: "network-path reference", given: "//evil.example/v1/tasks/t1"},
		{name: "another host", given: "http://evil.example/v1/tasks/t1"},
		{name: "another scheme", given: "https://" + host + "/api/v1/tasks/t1"},
		{name: "another port", given: "http://" + strings.Split(host, ":")[0] + ":1/api/v1/tasks/t1"},
	}
	for _, tt := range tests {
		if _, err := c.Get(context.Background(), tt.given); err == nil {
			t.Errorf("%s: Get(%q) succeeded", tt.name, tt.given)
		}
		if _, err := c.Send(context.Background(), http.MethodPost, tt.given, "k", nil); err == nil {
			t.Errorf("%s: Send(%q) succeeded", tt.name, tt.given)
		}
	}
	if keys, _, _, _ := srv.seen(); len(keys) != 0 {
		t.Errorf("the server saw %d requests, want none", len(keys))
	}
}

func TestNewPanicsOnABaseURLThatIsNoHTTPURL(t *testing.T) {
	t.Parallel()
	for _, given := range []string{"", "localhost:8080", "/v1", "ftp://example.com", "http://",
		"https://api.example.com/v1?key=1", "https://api.example.com/v1#top", "http://h/%zz"} { // a path would be joined after the query or fragment
		func() {
			defer func() {
				if r := recover(); r == nil {
					t.Errorf("New(BaseURL %q) did not panic", given)
				} else if _, ok := r.(string); !ok {
					t.Errorf("New(BaseURL %q) panicked with %v, want its own message", given, r)
				}
			}()
			New(Config{BaseURL: given})
		}()
	}
}

// TestRedirectOffTheOriginIsNotFollowed: a server's redirect to another
// origin (here the same host on another port, where net/http would copy
// even Authorization) is answered to the caller as a *Problem, never
// followed: the request would carry Config.Header, the Idempotency-Key and
// the body there. A redirect on the origin is followed as before.
func TestRedirectOffTheOriginIsNotFollowed(t *testing.T) {
	t.Parallel()
	other := newFakeServer(t, answer{status: 201})
	srv := newFakeServer(t,
		answer{status: http.StatusTemporaryRedirect, header: map[string]string{"Location": other.URL + "/steal"}},
		answer{status: http.StatusTemporaryRedirect, header: map[string]string{"Location": "/v2/payments"}},
		answer{status: 201},
	)
	c := newTestClient(Config{BaseURL: srv.URL, Header: http.Header{"Authorization": {"Bearer tok"}, "X-Api-Key": {"secret"}}, Sleep: recordSleeps(new([]time.Duration))})

	_, err := c.Send(context.Background(), http.MethodPost, "/v1/payments", "k", map[string]int{"amount": 1})
	var p *Problem
	if !errors.As(err, &p) || p.Status != http.StatusTemporaryRedirect {
		t.Errorf("Send redirected off the origin = %v, want the 307 as a *Problem", err)
	}
	if keys, _, bodies, auth := other.seen(); len(keys) != 0 {
		t.Errorf("the other origin saw %d requests (keys %q, bodies %q, Authorization %q), want none", len(keys), keys, bodies, auth)
	}

	r, err := c.Send(context.Background(), http.MethodPost, "/v1/payments", "k", map[string]int{"amount": 1})
	if err != nil || r.Status != 201 {
		t.Fatalf("Send redirected on the origin = %v, %v; want the 201", r, err)
	}
	keys, paths, bodies, auth := srv.seen()
	if want := []string{"POST /v1/payments", "POST /v1/payments", "POST /v2/payments"}; !slices.Equal(paths, want) || keys[2] != "k" || bodies[2] != `{"amount":1}` || auth[2] != "Bearer tok" {
		t.Errorf("the origin saw %q with keys %q, bodies %q, Authorization %q; want %q, the redirect with the same key, body and header", paths, keys, bodies, auth, want)
	}
}

// TestARedirectLoopIsNotRetried: against a server that redirects forever,
// the tenth redirect answer comes back as a *Problem after 10 requests (as
// many as net/http follows), not MaxAttempts rounds of them: retrying
// cannot end a loop.
func TestARedirectLoopIsNotRetried(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	requests := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests++
		mu.Unlock()
		http.Redirect(w, r, "/v1/loop", http.StatusFound)
	}))
	t.Cleanup(srv.Close)
	c := newTestClient(Config{BaseURL: srv.URL, Sleep: recordSleeps(new([]time.Duration))})

	_, err := c.Get(context.Background(), "/v1/loop")

	var p *Problem
	if !errors.As(err, &p) || p.Status != http.StatusFound {
		t.Errorf("Get = %v, want the 302 as a *Problem", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if requests != 10 {
		t.Errorf("the server saw %d requests, want 10", requests)
	}
}

// TestPollNeedsATarget: a 202 without a Location gives Poll an empty
// target; Poll refuses it before reading anything, rather than poll
// BaseURL itself (an empty path to Send and Get) and take the API's root
// for the task.
func TestPollNeedsATarget(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, answer{status: 202})
	c := newTestClient(Config{BaseURL: srv.URL + "/api", Sleep: recordSleeps(new([]time.Duration))})

	r, err := c.Send(context.Background(), http.MethodPost, "/v1/payments", "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Poll(context.Background(), r.Location(), r.RetryAfter(), func(*Response) (bool, error) { return true, nil })

	if err == nil || !strings.Contains(err.Error(), "Location") {
		t.Errorf("Poll(%q) = %v, want a refusal naming the missing Location", r.Location(), err)
	}
	if _, paths, _, _ := srv.seen(); len(paths) != 1 {
		t.Errorf("the server saw %q, want the POST alone", paths)
	}
}

// TestErrorsNeverShowAURLsPassword: a password in BaseURL or in a Location
// (user:password@host) is left out of every error the client returns, as
// net/http leaves it out of its own: errors end up in logs.
func TestErrorsNeverShowAURLsPassword(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t,
		answer{drop: true},
		answer{status: 200, body: strings.Repeat("x", 11)},
		withHeader(problem(503, "upstream_down", "true"), "Retry-After", "3600"),
	)
	withPassword := strings.Replace(srv.URL, "http://", "http://user:s3cret@", 1)
	c := newTestClient(Config{BaseURL: withPassword, MaxAttempts: 1, PollTimeout: time.Minute, Sleep: recordSleeps(new([]time.Duration))})
	c.maxAnswer = 10

	var errs []error
	_, err := c.Send(context.Background(), http.MethodPost, "/v1/payments", "k", nil) // dropped
	errs = append(errs, err)
	_, err = c.Get(context.Background(), "/v1/exports/e1") // too large
	errs = append(errs, err)
	c.cfg.MaxAttempts = 2
	_, err = c.Get(context.Background(), "/v1/exports/e1") // Retry-After over MaxRetryAfter
	errs = append(errs, err)
	_, err = c.Poll(context.Background(), withPassword+"/v1/tasks/t1", time.Hour, nil) // a wait past PollTimeout
	errs = append(errs, err)
	_, err = c.Poll(context.Background(), "http://user:s3cret@evil.example/v1/tasks/t1", 0, nil) // another origin
	errs = append(errs, err)
	_, err = c.Get(context.Background(), "//user:s3cret@evil.example/v1/tasks/t1") // a network-path reference
	errs = append(errs, err)
	_, err = c.Get(context.Background(), "//user:s3cret@evil.example/%zz") // no URL at all
	errs = append(errs, err)

	for i, err := range errs {
		if err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("error %d = %v, want an error without the password", i, err)
		}
	}
}

// TestPollCutsTheFirstWaitToMaxRetryAfter: the documented
// Poll(ctx, r.Location(), r.RetryAfter(), done) cuts a 202's long
// Retry-After to MaxRetryAfter, as it cuts every later answer's, rather
// than give up at once because the hint alone would pass PollTimeout.
func TestPollCutsTheFirstWaitToMaxRetryAfter(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t,
		answer{status: 202, header: map[string]string{"Location": "/v1/tasks/t1", "Retry-After": "3600"}},
		answer{status: 200, body: `{"status":"succeeded"}`},
	)
	var waits []time.Duration
	c := newTestClient(Config{BaseURL: srv.URL, Sleep: recordSleeps(&waits)})

	r, err := c.Send(context.Background(), http.MethodPost, "/v1/exports", "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Poll(context.Background(), r.Location(), r.RetryAfter(), func(*Response) (bool, error) { return true, nil })

	if err != nil || !slices.Equal(waits, []time.Duration{time.Minute}) {
		t.Errorf("Poll = %v after waits %v, want success after one wait of MaxRetryAfter (1m)", err, waits)
	}
}

// TestHTTPClientsCheckRedirectDecidesOnTheOriginOnly: a caller's
// CheckRedirect that allows every redirect still never lets one leave the
// origin; on the origin it decides (here: refusing all, so the 307 comes
// back), and the caller's HTTPClient itself is left as it was.
func TestHTTPClientsCheckRedirectDecidesOnTheOriginOnly(t *testing.T) {
	t.Parallel()
	other := newFakeServer(t)
	srv := newFakeServer(t,
		answer{status: http.StatusTemporaryRedirect, header: map[string]string{"Location": other.URL + "/steal"}},
		answer{status: http.StatusTemporaryRedirect, header: map[string]string{"Location": "/v2/payments"}},
	)
	allowAll := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return nil }}
	c := newTestClient(Config{BaseURL: srv.URL, HTTPClient: allowAll, Header: http.Header{"X-Api-Key": {"secret"}}, Sleep: recordSleeps(new([]time.Duration))})
	var p *Problem
	if _, err := c.Send(context.Background(), http.MethodPost, "/v1/payments", "k", nil); !errors.As(err, &p) || p.Status != http.StatusTemporaryRedirect {
		t.Errorf("Send redirected off the origin = %v, want the 307 as a *Problem", err)
	}
	if keys, _, _, _ := other.seen(); len(keys) != 0 {
		t.Errorf("the other origin saw %d requests, want none", len(keys))
	}
	allowAll.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	refuseAll := allowAll
	c = newTestClient(Config{BaseURL: srv.URL, HTTPClient: refuseAll, Sleep: recordSleeps(new([]time.Duration))})
	if _, err := c.Send(context.Background(), http.MethodPost, "/v1/payments", "k", nil); !errors.As(err, &p) || p.Status != http.StatusTemporaryRedirect {
		t.Errorf("Send redirected on the origin with a CheckRedirect refusing it = %v, want the 307 as a *Problem", err)
	}
	if _, paths, _, _ := srv.seen(); len(paths) != 2 {
		t.Errorf("the origin saw %q, want two requests", paths)
	}
}

// TestConcurrentSendsRetryAndPoll: 64 goroutines share one Client, each
// Send meeting a 503 before its 202 and each Poll a 503 before its 200 (run
// under -race): every retry carries its own Send's key and body, never
// another's, and Config.Header goes with every request.
func TestConcurrentSendsRetryAndPoll(t *testing.T) {
	t.Parallel()
	const senders = 64
	var mu sync.Mutex
	seen := map[string][]string{} // "METHOD path key" -> bodies
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		k := r.Method + " " + r.URL.Path + " " + r.Header.Get("Idempotency-Key")
		mu.Lock()
		seen[k] = append(seen[k], string(body)+" "+r.Header.Get("X-Api-Key"))
		n := len(seen[k])
		mu.Unlock()
		switch {
		case n == 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		case r.Method == http.MethodPost:
			w.Header().Set("Location", "/v1/tasks/"+r.Header.Get("Idempotency-Key"))
			w.WriteHeader(http.StatusAccepted)
		default:
			io.WriteString(w, `{"status":"succeeded"}`)
		}
	}))
	t.Cleanup(srv.Close)
	c := New(Config{BaseURL: srv.URL, Header: http.Header{"X-Api-Key": {"secret"}}, Sleep: recordSleeps(new([]time.Duration))})

	var wg sync.WaitGroup
	for i := range senders {
		wg.Go(func() {
			id := RequestID("export", i)
			r, err := c.Send(context.Background(), http.MethodPost, "/v1/exports", id, map[string]int{"n": i})
			if err != nil {
				t.Errorf("Send %d: %v", i, err)
				return
			}
			if _, err := c.Poll(context.Background(), r.Location(), r.RetryAfter(), func(*Response) (bool, error) { return true, nil }); err != nil {
				t.Errorf("Poll %d: %v", i, err)
			}
		})
	}
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	for i := range senders {
		id := RequestID("export", i)
		body := fmt.Sprintf(`{"n":%d} secret`, i)
		if got := seen["POST /v1/exports "+id]; !slices.Equal(got, []string{body, body}) {
			t.Errorf("Send %d: the server saw %q under its key, want %q twice", i, got, body)
		}
		if got := seen["GET /v1/tasks/"+id+" "]; !slices.Equal(got, []string{" secret", " secret"}) {
			t.Errorf("Poll %d: the server saw %q, want two reads with the header", i, got)
		}
	}
}

// TestNewPanicsOnAHeaderThatCannotBeSent: a Config.Header no request can
// carry (a token read from a file with its newline) is refused by New, as a
// BaseURL it cannot use is, without printing the value (a credential);
// it is not an error each Send retries MaxAttempts times as if the
// network had failed.
func TestNewPanicsOnAHeaderThatCannotBeSent(t *testing.T) {
	t.Parallel()
	for _, given := range []http.Header{
		{"Authorization": {"Bearer s3cret\n"}},
		{"Authorization": {"Bearer s3cret\r\nX-Injected: 1"}},
		{"X-Api-Key": {"s3cret\x00"}},
		{"Bad Name": {"v"}},
		{"": {"v"}},
	} {
		func() {
			defer func() {
				r := recover()
				if msg, ok := r.(string); !ok || strings.Contains(msg, "s3cret") {
					t.Errorf("New(Header %q) panicked with %v, want a panic of its own without the value", given, r)
				}
			}()
			New(Config{BaseURL: "https://api.example.com", Header: given})
		}()
	}
	New(Config{BaseURL: "https://api.example.com", Header: http.Header{"Authorization": {"Bearer\ttok"}, "X-Empty": {""}}})
}
