package sdkretry_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	idem "github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/redisstore"
)

// server is an echo API protected by the middleware, with one route whose
// handler blocks while its request says so. It counts, per idempotency
// key, the requests that reach it and the answers it gave.
type server struct {
	url     string
	runs    atomic.Int64
	entered chan struct{} // a blocking handler runs
	release chan struct{} // closed: blocking handlers return

	mu       sync.Mutex
	answered map[string][]int // key → statuses, in order
	onAnswer func(key string, status int)
}

func newServer(t *testing.T, cfg idem.Config) *server {
	t.Helper()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	s := &server{entered: make(chan struct{}, 1), release: make(chan struct{}), answered: map[string][]int{}}
	cfg.Store = redisstore.New(rdb)
	cfg.Scope = func(echo.Context) (string, string, error) { return "acme", "alice", nil } // stand-in for auth
	e := echo.New()
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc { // counts what reaches the server
		return func(c echo.Context) error {
			err := next(c)
			key := c.Request().Header.Get("Idempotency-Key")
			s.mu.Lock()
			s.answered[key] = append(s.answered[key], c.Response().Status)
			hook := s.onAnswer
			s.mu.Unlock()
			if hook != nil {
				hook(key, c.Response().Status)
			}
			return err
		}
	})
	e.Use(idem.New(cfg))
	e.POST("/v1/charges", func(c echo.Context) error {
		n := s.runs.Add(1)
		if c.Request().Header.Get("X-Block") != "" {
			s.entered <- struct{}{}
			<-s.release
		}
		return c.JSON(http.StatusCreated, map[string]any{"id": "ch_" + string(rune('0'+n))})
	})
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

func (s *server) statuses(key string) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.answered[key]...)
}

// sdk is the generated client, pointed at the server.
func sdk(s *server, retries int) openai.Client {
	return openai.NewClient(option.WithBaseURL(s.url+"/"), option.WithAPIKey("test"), option.WithMaxRetries(retries))
}

type charge struct {
	ID string `json:"id"`
}

// TestSDKSendsKeyReusedOnce: a key used again with other parameters is a
// decision for the caller. The SDK, which retries a 409 by its status,
// obeys x-should-retry: false and sends the request once; before the
// hint it sent it 1 + MaxRetries times, with backoff, before its caller
// learned of the conflict.
func TestSDKSendsKeyReusedOnce(t *testing.T) {
	t.Parallel()
	s := newServer(t, idem.Config{})
	client := sdk(s, 3)
	ctx := context.Background()
	var first charge
	if err := client.Post(ctx, "v1/charges", map[string]any{"amount": 100}, &first, option.WithHeader("Idempotency-Key", "order-1")); err != nil {
		t.Fatalf("first charge: %v", err)
	}
	var again charge
	err := client.Post(ctx, "v1/charges", map[string]any{"amount": 900}, &again, option.WithHeader("Idempotency-Key", "order-1"))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusConflict || !strings.Contains(string(apiErr.DumpResponse(true)), `"code":"key_reused"`) {
		t.Fatalf("charge with other parameters: %v, want the SDK's error for 409 key_reused", err)
	}
	if got := s.statuses("order-1"); len(got) != 2 || got[1] != http.StatusConflict {
		t.Errorf("the server answered %v for order-1, want [201 409]: the SDK resent key_reused", got)
	}
	if n := s.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

// TestSDKWithoutHintResendsKeyReused is the control: the same answer
// without x-should-retry (an ErrorHandler that drops it) is resent by the
// SDK, so the test above counts what the header does, not an SDK that
// never retries a 409.
func TestSDKWithoutHintResendsKeyReused(t *testing.T) {
	t.Parallel()
	s := newServer(t, idem.Config{ErrorHandler: func(c echo.Context, p idemgate.Problem) error {
		c.Response().Header().Del("X-Should-Retry")
		return nil // the default problem+json
	}})
	client := sdk(s, 1)
	ctx := context.Background()
	if err := client.Post(ctx, "v1/charges", map[string]any{"amount": 100}, nil, option.WithHeader("Idempotency-Key", "order-1")); err != nil {
		t.Fatalf("first charge: %v", err)
	}
	err := client.Post(ctx, "v1/charges", map[string]any{"amount": 900}, nil, option.WithHeader("Idempotency-Key", "order-1"))
	if err == nil {
		t.Fatal("charge with other parameters succeeded")
	}
	if got := s.statuses("order-1"); len(got) != 3 {
		t.Errorf("without the hint the server answered %v, want [201 409 409]: one retry by status", got)
	}
}

// TestSDKRetriesRequestInProgress: while the first request with a key
// still runs, the SDK's request gets 409 request_in_progress with
// x-should-retry: true and Retry-After; the SDK waits and retries, and
// gets the first request's answer replayed. The handler runs once.
func TestSDKRetriesRequestInProgress(t *testing.T) {
	t.Parallel()
	s := newServer(t, idem.Config{Lease: 3 * time.Second}) // Retry-After: Lease/3 = 1 s
	var once sync.Once
	s.onAnswer = func(key string, status int) {
		if key == "order-2" && status == http.StatusConflict {
			once.Do(func() { close(s.release) }) // the SDK was told to wait: let the first request finish
		}
	}
	holder := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/charges", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "order-2")
		req.Header.Set("X-Block", "1")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
		}
		holder <- res
	}()
	<-s.entered

	var got charge
	client := sdk(s, 2)
	err := client.Post(context.Background(), "v1/charges", map[string]any{"amount": 100}, &got,
		option.WithHeader("Idempotency-Key", "order-2"))
	if err != nil {
		t.Fatalf("SDK: %v, want the first request's answer after a retry", err)
	}
	if res := <-holder; res != nil {
		res.Body.Close()
	}
	if got.ID != "ch_1" {
		t.Errorf("SDK got charge %q, want the first request's ch_1 (replayed)", got.ID)
	}
	statuses := s.statuses("order-2")
	want := []int{http.StatusConflict, http.StatusCreated, http.StatusCreated} // the SDK's 409, the holder's 201 and the SDK's replay, in either order of the last two
	if len(statuses) != len(want) || statuses[0] != http.StatusConflict {
		t.Errorf("the server answered %v for order-2, want one 409 to the SDK, then the two 201s", statuses)
	}
	if n := s.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}
