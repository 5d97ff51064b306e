package middleware_test

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
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/redisstore"
)

// txStore is a TxStore on miniredis for the middleware's own tests: its
// transactions are counters, and a commit with a completion calls
// Complete (pgrecords does it in the database's transaction).
type txStore struct {
	idemgate.Store
	begun, committed, rolledBack atomic.Int64
	loseNext                     atomic.Bool // the next completion finds its claim gone

	// Set before the requests: what Begin, Commit and Rollback fail with.
	beginErr, commitErr, rollbackErr error
}

type txCtxKey struct{}

type fakeTx struct{ s *txStore }

func (s *txStore) Begin(context.Context) (idemgate.Tx, error) {
	if s.beginErr != nil {
		return nil, s.beginErr
	}
	s.begun.Add(1)
	return fakeTx{s}, nil
}

func (t fakeTx) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, txCtxKey{}, t)
}

func (t fakeTx) Commit(ctx context.Context, c *idemgate.Completion) error {
	if t.s.commitErr != nil {
		t.s.rolledBack.Add(1)
		return t.s.commitErr
	}
	if c != nil {
		if t.s.loseNext.Swap(false) {
			t.s.rolledBack.Add(1)
			return idemgate.ErrLeaseLost
		}
		if err := t.s.Complete(ctx, c.Key, c.Token, c.Response, c.Retention); err != nil {
			t.s.rolledBack.Add(1)
			return err
		}
	}
	t.s.committed.Add(1)
	return nil
}

func (t fakeTx) Rollback(context.Context) error {
	t.s.rolledBack.Add(1)
	return t.s.rollbackErr
}

func atomicEnv(t *testing.T, h handlerFunc) (*env, *txStore) {
	t.Helper()
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	s := &txStore{Store: redisstore.New(client)}
	v := newEnvOn(t, mr, client, s, func(c *middleware.Config) {
		c.Atomic = true
		c.MaxResponseBytes = 1024
	}, func(c echo.Context, n int64) error {
		if c.Request().Context().Value(txCtxKey{}) == nil {
			return errors.New("no transaction in the handler's context")
		}
		if h != nil {
			return h(c, n)
		}
		return defaultHandler(c, n)
	})
	return v, s
}

// TestAtomicAnswers: on an Atomic route the stored answer commits and
// then goes out; what would be released rolls back, and the answer that
// replaces a rolled back one carries none of the handler's headers.
func TestAtomicAnswers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name           string
		handler        handlerFunc
		lose           bool
		want           want
		committed      int64
		rolledBack     int64
		noHandlerHeads bool
	}{
		{name: "stored", want: want{status: 201, calls: 1, events: "claimed"}, committed: 1},
		{name: "5xx", handler: func(c echo.Context, n int64) error {
			c.Response().Header().Set("X-Run", "1")
			return c.String(http.StatusBadGateway, "upstream")
		}, want: want{status: 502, calls: 1, events: "claimed,released(not_cacheable)"}, rolledBack: 1},
		{name: "error", handler: func(c echo.Context, n int64) error {
			c.Response().Header().Set("X-Run", "1")
			c.String(http.StatusCreated, "written before the error")
			return echo.NewHTTPError(http.StatusTeapot, "nope")
		}, want: want{status: 418, calls: 1, events: "claimed,released(handler_error)"}, rolledBack: 1, noHandlerHeads: true},
		{name: "oversized", handler: func(c echo.Context, n int64) error {
			c.Response().Header().Set("X-Run", "1")
			return c.String(http.StatusCreated, strings.Repeat("x", 2048))
		}, want: want{status: 500, code: "response_too_large", calls: 1, events: "claimed,released(response_too_large)"}, rolledBack: 1, noHandlerHeads: true},
		{name: "lost claim", lose: true,
			want: want{status: 503, code: "lease_lost", calls: 1, events: "claimed,lease_lost(commit)"}, rolledBack: 1, noHandlerHeads: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v, s := atomicEnv(t, tt.handler)
			s.loseNext.Store(tt.lose)
			rec := v.do(req{key: "k", body: imageBody})
			tt.want.check(t, v, rec)
			if s.committed.Load() != tt.committed || s.rolledBack.Load() != tt.rolledBack {
				t.Errorf("committed %d, rolled back %d; want %d and %d", s.committed.Load(), s.rolledBack.Load(), tt.committed, tt.rolledBack)
			}
			if tt.noHandlerHeads && (rec.Header().Get("X-Run") != "" || rec.Header().Get("Set-Cookie") != "") {
				t.Errorf("the answer that replaced a rolled back one carries the handler's headers: %v", rec.Header())
			}
			if tt.lose && rec.Header().Get("Retry-After") != "1" {
				t.Errorf("lease_lost Retry-After = %q, want 1", rec.Header().Get("Retry-After"))
			}
		})
	}
}

// TestAtomicHijackRefused: an Atomic handler cannot hijack the
// connection, and its flushes send nothing before the commit.
func TestAtomicHijackRefused(t *testing.T) {
	t.Parallel()
	var hijackErr error
	v, _ := atomicEnv(t, func(c echo.Context, n int64) error {
		_, _, hijackErr = http.NewResponseController(c.Response()).Hijack()
		c.Response().WriteHeader(http.StatusCreated)
		c.Response().Flush()
		_, err := c.Response().Write([]byte("done"))
		return err
	})
	w := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
	v.e.ServeHTTP(w, req{key: "k", body: imageBody}.build())
	if hijackErr == nil {
		t.Errorf("Hijack on an Atomic route succeeded")
	}
	if w.flushes.Load() != 0 {
		t.Errorf("a flush reached the client before the commit")
	}
	if w.Code != http.StatusCreated || w.Body.String() != "done" {
		t.Errorf("answer = %d %q, want 201 done", w.Code, w.Body)
	}
}

type flushRecorder struct {
	*httptest.ResponseRecorder
	flushes atomic.Int64
}

func (w *flushRecorder) Flush() { w.flushes.Add(1); w.ResponseRecorder.Flush() }

// TestAtomicRace: many requests with one key at once on an Atomic route:
// one transaction commits a completion, every request gets its answer.
func TestAtomicRace(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	s := &txStore{Store: redisstore.New(client)}
	v := newEnvOn(t, mr, client, s, func(c *middleware.Config) {
		c.Atomic = true
		c.WaitInFlight = 30 * time.Second
	}, nil)
	const n = 32
	codes := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { codes[i] = v.do(req{key: "k", body: imageBody}).Code })
	}
	wg.Wait()
	for i, c := range codes {
		if c != http.StatusCreated {
			t.Errorf("request %d = %d, want 201", i, c)
		}
	}
	if v.calls.Load() != 1 || s.begun.Load() != 1 || s.committed.Load() != 1 {
		t.Errorf("%d runs, %d transactions, %d commits; want 1, 1, 1", v.calls.Load(), s.begun.Load(), s.committed.Load())
	}
}

// TestAtomicEveryRequestHasATransaction: a request without a key, or of a
// method the middleware does not protect, runs in a transaction of its
// own on an Atomic route.
func TestAtomicEveryRequestHasATransaction(t *testing.T) {
	t.Parallel()
	v, s := atomicEnv(t, nil)
	want{status: 201, calls: 1}.check(t, v, v.do(req{body: imageBody}))
	want{status: 201, calls: 2}.check(t, v, v.do(req{method: http.MethodPut, key: "k", body: imageBody}))
	if s.begun.Load() != 2 || s.committed.Load() != 2 {
		t.Errorf("%d transactions, %d commits; want 2 and 2", s.begun.Load(), s.committed.Load())
	}
}
