package middleware_test

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/redisstore"
)

// TestStorm: 200 concurrent identical requests with one key against a real
// redis-server, on one or two echo instances ("nodes") that share it. The
// handler runs once; every answer is the original response, its
// byte-identical replay, or (without WaitInFlight) 409 request_in_progress.
func TestStorm(t *testing.T) {
	t.Parallel()
	type given struct {
		nodes int           // echo instances sharing the Redis
		wait  time.Duration // Config.WaitInFlight
	}
	tests := []struct {
		name  string
		given given
		want  struct{ allReplays bool }
	}{
		{name: "one node, answer at once", given: given{nodes: 1}},
		{name: "one node, wait in flight", given: given{nodes: 1, wait: 20 * time.Second}, want: struct{ allReplays bool }{true}},
		{name: "two nodes, answer at once", given: given{nodes: 2}},
		{name: "two nodes, wait in flight", given: given{nodes: 2, wait: 20 * time.Second}, want: struct{ allReplays bool }{true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			opts := testenv.Redis(t)
			var runs atomic.Int64
			handler := func(c echo.Context) error {
				runs.Add(1)
				time.Sleep(100 * time.Millisecond) // slow: the storm arrives while it runs
				var b [16]byte
				_, _ = rand.Read(b[:])
				c.Response().Header().Set("X-Result", hex.EncodeToString(b[:]))
				return c.Blob(http.StatusCreated, "application/octet-stream", b[:])
			}
			nodes := make([]*echo.Echo, tt.given.nodes)
			for i := range nodes {
				client := redis.NewClient(opts) // each node its own connection pool
				t.Cleanup(func() { client.Close() })
				e := echo.New()
				e.POST("/v1/images", handler, middleware.New(middleware.Config{
					Store:        redisstore.New(client),
					Scope:        testScope,
					WaitInFlight: tt.given.wait,
				}))
				nodes[i] = e
			}

			const n = 200
			recs := make([]*httptest.ResponseRecorder, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					rec := httptest.NewRecorder()
					nodes[i%len(nodes)].ServeHTTP(rec, req{key: "storm", body: imageBody}.build())
					recs[i] = rec
				}()
			}
			close(start)
			wg.Wait()

			if got := runs.Load(); got != 1 {
				t.Fatalf("handler ran %d times, want 1", got)
			}
			var original *httptest.ResponseRecorder
			counts := map[string]int{}
			for _, rec := range recs {
				switch {
				case rec.Code == http.StatusCreated && rec.Header().Get("Idempotent-Replayed") == "":
					counts["original"]++
					original = rec
				case rec.Code == http.StatusCreated:
					counts["replay"]++
				case rec.Code == http.StatusConflict && problemCode(t, rec) == "request_in_progress":
					counts["in_progress"]++
				default:
					t.Errorf("unexpected answer %d %s", rec.Code, rec.Body)
				}
			}
			if counts["original"] != 1 {
				t.Fatalf("answers %v, want exactly one original", counts)
			}
			for _, rec := range recs {
				if rec.Code != http.StatusCreated {
					continue
				}
				if rec.Body.String() != original.Body.String() || rec.Header().Get("X-Result") != original.Header().Get("X-Result") {
					t.Errorf("replay %x / %s differs from the original %x / %s",
						rec.Body.Bytes(), rec.Header().Get("X-Result"), original.Body.Bytes(), original.Header().Get("X-Result"))
				}
			}
			if tt.want.allReplays && counts["replay"] != n-1 {
				t.Errorf("answers %v, want the original and %d replays", counts, n-1)
			}
			t.Logf("answers: %v", counts)
		})
	}
}
