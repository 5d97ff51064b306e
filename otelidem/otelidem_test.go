package otelidem_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/otelidem"
)

// bundle is a Recorder on an SDK whose metrics are read with a
// ManualReader and whose spans are kept in memory.
type bundle struct {
	rec    *otelidem.Recorder
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
}

func setup(t testing.TB, cfg otelidem.Config) *bundle {
	t.Helper()
	b := &bundle{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(b.reader))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b.spans))
	t.Cleanup(func() {
		_ = mp.Shutdown(context.Background())
		_ = tp.Shutdown(context.Background())
	})
	cfg.MeterProvider, cfg.TracerProvider = mp, tp
	rec, err := otelidem.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.rec = rec
	return b
}

// collect reads every instrument once.
func (b *bundle) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := b.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

// find returns the metric called name, failing the test when it is absent.
func find(t *testing.T, rm metricdata.ResourceMetrics, name string) metricdata.Metrics {
	t.Helper()
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m
			}
		}
	}
	t.Fatalf("no metric %q", name)
	return metricdata.Metrics{}
}

// matches reports whether set holds every attribute of want.
func matches(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		v, ok := set.Value(kv.Key)
		if !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// count sums a counter's points, or a histogram's counts, whose attributes
// include want.
func count(t *testing.T, rm metricdata.ResourceMetrics, name string, want ...attribute.KeyValue) int64 {
	t.Helper()
	var n int64
	switch d := find(t, rm, name).Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				n += p.Value
			}
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				n += int64(p.Count)
			}
		}
	default:
		t.Fatalf("metric %q has data %T", name, d)
	}
	return n
}

// allAttributes returns every attribute value of every point of every metric.
func allAttributes(rm metricdata.ResourceMetrics) []attribute.KeyValue {
	var out []attribute.KeyValue
	add := func(s attribute.Set) { out = append(out, s.ToSlice()...) }
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					add(p.Attributes)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					add(p.Attributes)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					add(p.Attributes)
				}
			}
		}
	}
	return out
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
		Store: b.rec.Store(middleware.NewRedisStore(rdb)),
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

			rm := b.collect(t)
			const requests = "idemgate.requests"
			route := attribute.String("http.route", "/v1/images")
			for _, c := range []struct {
				outcome string
				want    int64
			}{
				{"claimed", 2}, {"replayed", 1}, {"reused", 1}, {"in_progress", 1}, {"store_error", 1},
				{"released", 0}, {"lease_lost", 0}, {"fail_open", 0},
			} {
				if got := count(t, rm, requests, attribute.String("idemgate.outcome", c.outcome), route,
					attribute.String("idemgate.kind", "images"), attribute.String("http.request.method", "POST")); got != c.want {
					t.Errorf("%s{outcome=%s} = %d, want %d", requests, c.outcome, got, c.want)
				}
			}
			if got := count(t, rm, requests, attribute.String("idemgate.outcome", "store_error"),
				attribute.String("idemgate.reason", "claim")); got != 1 {
				t.Errorf("store_error with reason claim = %d, want 1", got)
			}
			// Every decision was timed: two claims, a replay, a conflict, an in-progress.
			if got := count(t, rm, "idemgate.decision.duration"); got != 5 {
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
				if got := count(t, rm, "idemgate.store.duration", attribute.String("idemgate.operation", c.op),
					attribute.String("idemgate.result", c.result)); got != c.want {
					t.Errorf("idemgate.store.duration{%s,%s} count = %d, want %d", c.op, c.result, got, c.want)
				}
			}

			tenants := 0
			for _, kv := range allAttributes(rm) {
				v := kv.Value.Emit()
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

// TestStoreSpans checks that the store calls are children of the request's
// span, which continues the caller's trace.
func TestStoreSpans(t *testing.T) {
	b := setup(t, otelidem.Config{})
	s := newService(t, b)
	if rec := s.post("poster:launch:1", "a lighthouse"); rec.Code != http.StatusAccepted {
		t.Fatalf("status %d", rec.Code)
	}
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, sp := range b.spans.Ended() {
		byName[sp.Name()] = sp
	}
	server, ok := byName["POST /v1/images"]
	if !ok {
		t.Fatalf("no server span; spans: %v", names(b.spans.Ended()))
	}
	if got := server.SpanContext().TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("server span trace %s does not continue the caller's", got)
	}
	for _, name := range []string{"idemgate.claim", "idemgate.complete"} {
		sp, ok := byName[name]
		if !ok {
			t.Fatalf("no %s span; spans: %v", name, names(b.spans.Ended()))
		}
		if sp.Parent().SpanID() != server.SpanContext().SpanID() {
			t.Errorf("%s parent = %s, want the server span %s", name, sp.Parent().SpanID(), server.SpanContext().SpanID())
		}
		for _, kv := range sp.Attributes() {
			if strings.Contains(kv.Value.Emit(), "poster:launch") {
				t.Errorf("%s attribute %s carries the key", name, kv.Key)
			}
		}
	}
	var status int64
	for _, kv := range server.Attributes() {
		if kv.Key == "http.response.status_code" {
			status = kv.Value.AsInt64()
		}
	}
	if status != http.StatusAccepted {
		t.Errorf("server span status code %d, want 202", status)
	}
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name()
	}
	return out
}

// TestFailOpenMetrics: with FailOpen, a request while the store is down
// runs unprotected; the metrics say so (store_error at the claim, then
// fail_open) and the handler answers.
func TestFailOpenMetrics(t *testing.T) {
	b := setup(t, otelidem.Config{})
	s := newService(t, b)
	s.e.POST("/v1/open", func(c echo.Context) error { return c.NoContent(http.StatusAccepted) },
		middleware.New(middleware.Config{
			Store:    b.rec.Store(middleware.NewRedisStore(s.rdb)),
			Scope:    func(c echo.Context) (string, string, error) { return "acme", "alice", nil },
			Kind:     "open",
			FailOpen: true,
			OnEvent:  b.rec.OnEvent,
		}))
	s.mr.Close()
	if rec := s.postTo("/v1/open", "k", "p"); rec.Code != http.StatusAccepted {
		t.Fatalf("status %d, want the handler's 202", rec.Code)
	}
	rm := b.collect(t)
	route := attribute.String("http.route", "/v1/open")
	for outcome, want := range map[string]int64{"store_error": 1, "fail_open": 1, "claimed": 0} {
		if got := count(t, rm, "idemgate.requests", route, attribute.String("idemgate.outcome", outcome)); got != want {
			t.Errorf("idemgate.requests{%s} = %d, want %d", outcome, got, want)
		}
	}
}
