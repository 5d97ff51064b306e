package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/proxy"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/internal/wait"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/redisstore"
)

// TestLostClaimReplyReal: Redis runs the claim but its reply arrives after
// the client's read timeout. The request is answered 503 store_unavailable,
// and the claim it may have made is released (fenced by its own token), so
// the client's retry runs at once instead of meeting 409
// request_in_progress for a whole lease with nothing running.
func TestLostClaimReplyReal(t *testing.T) {
	t.Parallel()
	opts := testenv.Redis(t)
	const readTimeout = time.Second // answers on a loaded machine come within it
	px, err := proxy.Start(opts.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	o := *opts
	o.Addr = px.Addr
	o.ReadTimeout, o.WriteTimeout = readTimeout, readTimeout
	o.MaxRetries = -1 // one lost reply is the case; go-redis's resends are TestResentClaim's
	client := redis.NewClient(&o)
	t.Cleanup(func() { client.Close() })
	v := newEnvOn(t, nil, client, redisstore.New(client), nil, nil)

	// Warm up: the scripts are loaded and a connection is pooled, so the
	// next reply on the wire is the claim's.
	warm := 0
	wait.For(t, time.Minute, "a warm-up request answered 201", func() bool {
		warm++
		return v.do(req{key: fmt.Sprint("warm-", warm), body: imageBody}).Code == 201
	})
	v.calls.Store(0)
	px.DelayReplies(1, 4*readTimeout)
	want{status: 503, code: "store_unavailable", calls: 0}.check(t, v, v.do(req{key: "k", body: imageBody}))
	if n := px.DelayedRepliesLeft(); n > 0 {
		t.Fatalf("no reply was held back (%d left): the test proves nothing", n)
	}
	// The claim ran in Redis: without the release the key would be held.
	rec := v.do(req{key: "k", body: imageBody})
	want{status: 201, calls: 1}.check(t, v, rec)
	t.Logf("events: %v", v.events.types())
}

// lostReply is a Store whose next Claim runs but whose answer is lost
// (lose), or fails without running (fail).
type lostReply struct {
	idemgate.Store
	lose, fail atomic.Bool
}

func (s *lostReply) Claim(ctx context.Context, key string, r idemgate.ClaimRequest) (idemgate.ClaimResult, error) {
	if s.fail.Swap(false) {
		return idemgate.ClaimResult{}, errors.New("connection refused")
	}
	res, err := s.Store.Claim(ctx, key, r)
	if err == nil && s.lose.Swap(false) {
		return idemgate.ClaimResult{}, errors.New("i/o timeout")
	}
	return res, err
}

// TestLostClaimReply: the same on miniredis, for fail closed and fail
// open, and for a claim that did not run (nothing to release; another
// request's claim is untouched).
func TestLostClaimReply(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		failOpen bool
		want     want // the request whose claim reply is lost
		events   string
	}{
		{name: "fail closed", want: want{status: 503, code: "store_unavailable"},
			events: "store_error(claim),released(claim_failed),claimed"},
		{name: "fail open", failOpen: true, want: want{status: 201, calls: 1},
			events: "store_error(claim),released(claim_failed),fail_open,claimed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			mr := miniredis.RunT(t)
			client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			t.Cleanup(func() { client.Close() })
			store := &lostReply{Store: redisstore.New(client)}
			v := newEnvOn(t, mr, client, store, func(c *middleware.Config) { c.FailOpen = tt.failOpen }, nil)
			store.lose.Store(true)
			tt.want.check(t, v, v.do(req{key: "k", body: imageBody}))
			// The retry runs: the lost claim was released.
			rec := v.do(req{key: "k", body: imageBody})
			if rec.Code != 201 || rec.Header().Get("Idempotent-Replayed") == "true" {
				t.Errorf("retry = %d replayed=%q %s, want a run", rec.Code, rec.Header().Get("Idempotent-Replayed"), rec.Body)
			}
			want{status: 201, calls: tt.want.calls + 1, events: tt.events}.check(t, v, rec)
		})
	}

	t.Run("another request's claim is untouched", func(t *testing.T) {
		t.Parallel()
		entered, release := make(chan struct{}), make(chan struct{})
		mr := miniredis.RunT(t)
		client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { client.Close() })
		store := &lostReply{Store: redisstore.New(client)}
		v := newEnvOn(t, mr, client, store, nil, func(c echo.Context, n int64) error {
			if n == 1 {
				close(entered)
				<-release
			}
			return defaultHandler(c, n)
		})
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- v.do(req{key: "k", body: imageBody}) }()
		<-entered
		// The claim of the second request fails without running: its
		// release must not delete the first request's claim.
		store.fail.Store(true)
		want{status: 503, code: "store_unavailable", calls: 1}.check(t, v, v.do(req{key: "k", body: imageBody}))
		want{status: 409, code: "request_in_progress", calls: 1}.check(t, v, v.do(req{key: "k", body: imageBody}))
		close(release)
		if rec := <-done; rec.Code != 201 {
			t.Fatalf("first request = %d %s", rec.Code, rec.Body)
		}
		want{status: 201, calls: 1, replayed: true,
			events: "claimed,store_error(claim),in_progress,replayed"}.check(t, v, v.do(req{key: "k", body: imageBody}))
	})
}
