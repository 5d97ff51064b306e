package otelidem_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/otelidem"
	"github.com/idemgate/idemgate/otelidem/internal/sdktest/oteltest"
	"github.com/idemgate/idemgate/redisstore"
)

// bundle is a Recorder on an SDK that the test reads.
type bundle struct {
	rec *otelidem.Recorder
	*oteltest.SDK
}

func setup(t testing.TB, cfg otelidem.Config) *bundle {
	t.Helper()
	sdk := oteltest.New(t)
	cfg.MeterProvider, cfg.TracerProvider = sdk.MeterProvider, sdk.TracerProvider
	rec, err := otelidem.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{rec: rec, SDK: sdk}
}

// service is an echo with one protected route on miniredis whose handler
// blocks while its request's body says "block".
type service struct {
	e       *echo.Echo
	mr      *miniredis.Miniredis
	rdb     *redis.Client
	entered chan struct{}
	release chan struct{}
}

func newService(t *testing.T, b *bundle) *service {
	t.Helper()
	s := &service{mr: miniredis.RunT(t), entered: make(chan struct{}, 1), release: make(chan struct{})}
	rdb := redis.NewClient(&redis.Options{Addr: s.mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	s.rdb = rdb
	s.e = echo.New()
	s.e.Use(b.rec.Server())
	idem := middleware.New(middleware.Config{
		Store: b.rec.Store(redisstore.New(rdb)),
		Scope: func(c echo.Context) (string, string, error) {
			return c.Request().Header.Get("X-Tenant"), c.Request().Header.Get("X-User"), nil
		},
		Kind:        "images",
		Fingerprint: fingerprint.Spec{Fields: []string{"/prompt"}},
		Required:    true,
		OnEvent:     b.rec.OnEvent,
	})
	s.e.POST("/v1/images", func(c echo.Context) error {
		var body struct{ Prompt string }
		if err := c.Bind(&body); err != nil {
			return err
		}
		if body.Prompt == "block" {
			s.entered <- struct{}{}
			<-s.release
		}
		return c.JSON(http.StatusAccepted, map[string]string{"prompt": body.Prompt})
	}, idem)
	return s
}

func (s *service) post(key, prompt string) *httptest.ResponseRecorder {
	return s.postTo("/v1/images", key, prompt)
}

func (s *service) postTo(path, key, prompt string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{"prompt":"`+prompt+`"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Tenant", "acme")
	req.Header.Set("X-User", "alice@example.com")
	// A caller's trace: the request's spans must continue it.
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	rec := httptest.NewRecorder()
	s.e.ServeHTTP(rec, req)
	return rec
}

// TestRequestMetrics runs a scripted sequence through the middleware and
// reads the instruments: a miss, its replay, a conflict, a request in
// progress, and a request while the store is down.
func TestRequestMetrics(t *testing.T) {
	for _, tenant := range []bool{false, true} {
		t.Run(map[bool]string{false: "no tenant", true: "tenant"}[tenant], func(t *testing.T) {
			b := setup(t, otelidem.Config{Tenant: tenant})
			s := newService(t, b)

			wantStatus := func(rec *httptest.ResponseRecorder, status int) {
				t.Helper()
				if rec.Code != status {
					t.Fatalf("status %d, want %d: %s", rec.Code, status, rec.Body)
				}
			}
			wantStatus(s.post("poster:launch:1", "a lighthouse"), http.StatusAccepted)  // miss
			wantStatus(s.post("poster:launch:1", "a lighthouse"), http.StatusAccepted)  // replay
			wantStatus(s.post("poster:launch:1", "a lighthouse!"), http.StatusConflict) // conflict

			var wg sync.WaitGroup
			wg.Add(1)
			go func() { // holds its key while the duplicate arrives
				defer wg.Done()
				s.post("poster:launch:2", "block")
			}()
			<-s.entered
			wantStatus(s.post("poster:launch:2", "block"), http.StatusConflict) // in progress
			close(s.release)
			wg.Wait()

			s.mr.Close()
			wantStatus(s.post("poster:launch:3", "a lighthouse"), http.StatusServiceUnavailable) // store down

			rm := b.Collect(t)
			const requests = "idemgate.requests"
			route := attribute.String("http.route", "/v1/images")
			for _, c := range []struct {
				outcome string
				want    int64
			}{
				{"claimed", 2}, {"replayed", 1}, {"reused", 1}, {"in_progress", 1}, {"store_error", 1},
				{"released", 0}, {"lease_lost", 0}, {"fail_open", 0},
			} {
				if got := oteltest.Count(t, rm, requests, attribute.String("idemgate.outcome", c.outcome), route,
					attribute.String("idemgate.kind", "images"), attribute.String("http.request.method", "POST")); got != c.want {
					t.Errorf("%s{outcome=%s} = %d, want %d", requests, c.outcome, got, c.want)
				}
			}
			if got := oteltest.Count(t, rm, requests, attribute.String("idemgate.outcome", "store_error"),
				attribute.String("idemgate.reason", "claim")); got != 1 {
				t.Errorf("store_error with reason claim = %d, want 1", got)
			}
			// Every decision was timed: two claims, a replay, a conflict, an in-progress.
			if got := oteltest.Count(t, rm, "idemgate.decision.duration"); got != 5 {
				t.Errorf("idemgate.decision.duration count = %d, want 5", got)
			}
			for _, c := range []struct {
				op, result string
				want       int64
			}{
				{"claim", "claimed", 2}, {"claim", "finished", 1}, {"claim", "mismatch", 1},
				{"claim", "running", 1}, {"claim", "error", 1}, {"complete", "ok", 2},
				{"release", "ok", 0},
			} {
				if got := oteltest.Count(t, rm, "idemgate.store.duration", attribute.String("idemgate.operation", c.op),
					attribute.String("idemgate.result", c.result)); got != c.want {
					t.Errorf("idemgate.store.duration{%s,%s} count = %d, want %d", c.op, c.result, got, c.want)
				}
			}

			tenants := 0
			for _, kv := range oteltest.Attributes(rm) {
				v := kv.Value.String()
				if strings.Contains(v, "poster:launch") || strings.Contains(v, "alice") || strings.Contains(v, "lighthouse") {
					t.Errorf("attribute %s = %q carries a key, user or body", kv.Key, v)
				}
				if kv.Key == "idemgate.tenant" {
					tenants++
					if v != "acme" {
						t.Errorf("idemgate.tenant = %q, want acme", v)
					}
				}
			}
			if tenant != (tenants > 0) {
				t.Errorf("Tenant %v, but %d points carry idemgate.tenant", tenant, tenants)
			}
		})
	}
}

// TestFailOpenMetrics: with FailOpen, a request while the store is down
// runs unprotected; the metrics say so (store_error at the claim, then
// fail_open) and the handler answers.
func TestFailOpenMetrics(t *testing.T) {
	b := setup(t, otelidem.Config{})
	s := newService(t, b)
	s.e.POST("/v1/open", func(c echo.Context) error { return c.NoContent(http.StatusAccepted) },
		middleware.New(middleware.Config{
			Store:    b.rec.Store(redisstore.New(s.rdb)),
			Scope:    func(c echo.Context) (string, string, error) { return "acme", "alice", nil },
			Kind:     "open",
			FailOpen: true,
			OnEvent:  b.rec.OnEvent,
		}))
	s.mr.Close()
	if rec := s.postTo("/v1/open", "k", "p"); rec.Code != http.StatusAccepted {
		t.Fatalf("status %d, want the handler's 202", rec.Code)
	}
	rm := b.Collect(t)
	route := attribute.String("http.route", "/v1/open")
	for outcome, want := range map[string]int64{"store_error": 1, "fail_open": 1, "claimed": 0} {
		if got := oteltest.Count(t, rm, "idemgate.requests", route, attribute.String("idemgate.outcome", outcome)); got != want {
			t.Errorf("idemgate.requests{%s} = %d, want %d", outcome, got, want)
		}
	}
}

// TestRequestMetricCardinality: the middleware on every route (e.Use), and
// a client that sends keyed POSTs to made-up paths (a 404 storm), under
// many tenants, users and keys, with different bodies for one key
// (conflicts). The request metrics stay at a handful of series per outcome
// and carry no path, key, tenant (not opted in) or user.
func TestRequestMetricCardinality(t *testing.T) {
	b := setup(t, otelidem.Config{})
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	e := echo.New()
	e.Use(b.rec.Server())
	e.Use(middleware.New(middleware.Config{
		Store: b.rec.Store(redisstore.New(rdb)),
		Scope: func(c echo.Context) (string, string, error) {
			return c.Request().Header.Get("X-Tenant"), c.Request().Header.Get("X-User"), nil
		},
		Fingerprint: fingerprint.Spec{Fields: []string{"/p"}},
		OnEvent:     b.rec.OnEvent,
	}))
	e.POST("/v1/a/:id", func(c echo.Context) error { return c.NoContent(http.StatusCreated) })
	for i := range 200 {
		for _, path := range []string{fmt.Sprintf("/nope-SECRETPATH/%d", i), fmt.Sprintf("/v1/a/SECRETID%d", i)} {
			for _, body := range []string{`{"p":"x"}`, `{"p":"y"}`} {
				req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", fmt.Sprintf("SECRETKEY-%d", i))
				req.Header.Set("X-Tenant", fmt.Sprintf("SECRETTENANT-%d", i))
				req.Header.Set("X-User", fmt.Sprintf("SECRETUSER-%d", i))
				e.ServeHTTP(httptest.NewRecorder(), req)
			}
		}
	}
	rm := b.Collect(t)
	sets := map[attribute.Distinct]bool{}
	for _, s := range oteltest.Points(rm, "idemgate.requests") {
		sets[s.Equivalent()] = true
	}
	if len(sets) == 0 || len(sets) > 8 {
		t.Errorf("idemgate.requests has %d series after 800 requests on 400 paths, want a handful", len(sets))
	}
	for _, kv := range oteltest.Attributes(rm) {
		if strings.Contains(kv.Value.String(), "SECRET") || kv.Key == "idemgate.tenant" {
			t.Errorf("metric attribute %s=%q carries client input", kv.Key, kv.Value.String())
		}
	}
	for _, s := range b.Spans.Ended() {
		if strings.Contains(s.Name(), "SECRET") {
			t.Errorf("span name %q carries client input", s.Name())
		}
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.String(), "SECRET") {
				t.Errorf("span %s attribute %s=%q carries client input", s.Name(), kv.Key, kv.Value.String())
			}
		}
	}
}

// BenchmarkOnEvent is the cost a request pays for its metrics, on the SDK.
func BenchmarkOnEvent(b *testing.B) {
	bu := setup(b, otelidem.Config{})
	ev := idemgate.Event{Type: idemgate.EventClaimed, Route: "POST /v1/images", Kind: "images", Tenant: "acme", Latency: time.Millisecond}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		bu.rec.OnEvent(ctx, ev)
	}
}

// TestConcurrentEvents records events from many goroutines at once (run
// it with -race): each distinct attribute set is built once and shared,
// and every event is counted under its own outcome.
func TestConcurrentEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, otelidem.Config{Tenant: true})
	types := []idemgate.EventType{idemgate.EventClaimed, idemgate.EventReplayed, idemgate.EventReused, idemgate.EventWaited}
	const goroutines, each = 32, 200 // each a multiple of len(types)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for i := range each {
				b.rec.OnEvent(context.Background(), idemgate.Event{Type: types[i%len(types)], Route: "POST /v1/images", Kind: "images",
					Tenant: "acme", Reason: "finished", Latency: time.Millisecond})
			}
		})
	}
	wg.Wait()
	rm := b.Collect(t)
	per := int64(goroutines * each / len(types))
	for _, typ := range types[:3] {
		if got := oteltest.Count(t, rm, "idemgate.requests", attribute.String("idemgate.outcome", typ.String()),
			attribute.String("idemgate.tenant", "acme")); got != per {
			t.Errorf("requests{%s} = %d, want %d", typ, got, per)
		}
	}
	if got := oteltest.Count(t, rm, "idemgate.decision.duration"); got != 3*per {
		t.Errorf("decision.duration count = %d, want %d", got, 3*per)
	}
	if got := oteltest.Count(t, rm, "idemgate.wait.duration", attribute.String("idemgate.wait.result", "finished")); got != per {
		t.Errorf("wait.duration{finished} count = %d, want %d", got, per)
	}
}
