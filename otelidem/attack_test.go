package otelidem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/otelidem"
	"github.com/idemgate/idemgate/pgstore"
)

// Attack: a client sends arbitrary request methods. The server span's
// name and its http.request.method attribute must not carry them (a span
// name per made-up method; OTel's HTTP conventions map unknown methods to
// _OTHER).
func TestAttackServerSpanUnknownMethod(t *testing.T) {
	b := setup(t, otelidem.Config{})
	e := echo.New()
	e.Use(b.rec.Server())
	e.Any("/v1/x", func(c echo.Context) error { return c.NoContent(http.StatusNoContent) })
	for i := range 20 {
		m := fmt.Sprintf("EVIL%dSECRET", i)
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, httptest.NewRequest(m, "/v1/x", nil))
		rec = httptest.NewRecorder()
		e.ServeHTTP(rec, httptest.NewRequest(m, fmt.Sprintf("/nope/%d", i), nil)) // 404 storm
	}
	spans := b.spans.Ended()
	if len(spans) != 40 {
		t.Fatalf("%d spans, want 40", len(spans))
	}
	for _, s := range spans {
		if strings.Contains(s.Name(), "SECRET") || strings.Contains(s.Name(), "/nope/") {
			t.Errorf("span name %q carries a client-chosen method or path", s.Name())
		}
		for _, kv := range s.Attributes() {
			if v := kv.Value.Emit(); strings.Contains(v, "SECRET") || strings.Contains(v, "/nope/") {
				t.Errorf("span %q attribute %s=%q carries a client-chosen value", s.Name(), kv.Key, v)
			}
		}
	}
}

// leakyStore fails every call with an error that names the key, as a
// hand-written store may.
type leakyStore struct{}

func (leakyStore) Claim(_ context.Context, key string, _ middleware.ClaimRequest) (middleware.ClaimResult, error) {
	return middleware.ClaimResult{}, fmt.Errorf("leaky: claim %s: %w", key, errors.New("down"))
}
func (leakyStore) Extend(_ context.Context, key string, _ middleware.Token, _ time.Duration) error {
	return fmt.Errorf("leaky: extend %s", key)
}
func (leakyStore) Complete(_ context.Context, key string, _ middleware.Token, _ middleware.Response, _ time.Duration) error {
	return fmt.Errorf("leaky: complete %s", key)
}
func (leakyStore) Release(_ context.Context, key string, _ middleware.Token) error {
	return fmt.Errorf("leaky: release %s", key)
}

// Attack: the store's error names the key. The store span records the
// error; the key must not reach the span (attributes or events).
func TestAttackStoreErrorKeyNotInSpan(t *testing.T) {
	b := setup(t, otelidem.Config{})
	s := b.rec.Store(leakyStore{})
	const key = "tenant-acme/user-alice/SECRETKEY-123"
	_, _ = s.Claim(context.Background(), key, middleware.ClaimRequest{})
	_ = s.Extend(context.Background(), key, middleware.Token{}, time.Second)
	_ = s.Complete(context.Background(), key, middleware.Token{}, middleware.Response{}, time.Second)
	_ = s.Release(context.Background(), key, middleware.Token{})
	spans := b.spans.Ended()
	if len(spans) != 4 {
		t.Fatalf("%d spans, want 4", len(spans))
	}
	for _, sp := range spans {
		if sp.Status().Code.String() != "Error" {
			t.Errorf("span %s status %v, want Error", sp.Name(), sp.Status())
		}
		for _, kv := range sp.Attributes() {
			if strings.Contains(kv.Value.Emit(), "SECRETKEY") {
				t.Errorf("span %s attribute %s carries the key", sp.Name(), kv.Key)
			}
		}
		if len(sp.Events()) == 0 {
			t.Errorf("span %s recorded no error event", sp.Name())
		}
		for _, ev := range sp.Events() {
			for _, kv := range ev.Attributes {
				if strings.Contains(kv.Value.Emit(), "SECRETKEY") {
					t.Errorf("span %s event %s attribute %s carries the key: %q", sp.Name(), ev.Name, kv.Key, kv.Value.Emit())
				}
			}
		}
	}
}

// Attack: Submit's error names the task's idempotency key; the submit
// span must not carry it.
func TestAttackSubmitErrorKeyNotInSpan(t *testing.T) {
	b := setup(t, otelidem.Config{})
	nt := pgstore.NewTask{Tenant: "acme", Owner: "alice", Kind: "image", IdempotencyKey: "SECRETKEY-9"}
	_, err := b.rec.Submit(context.Background(), nt, func(_ context.Context, t pgstore.NewTask) (pgstore.Task, error) {
		return pgstore.Task{}, fmt.Errorf("pgstore: submit %q: boom", t.IdempotencyKey)
	})
	if err == nil || !strings.Contains(err.Error(), "SECRETKEY") {
		t.Fatalf("Submit error %v, want the store's own error back unchanged", err)
	}
	spans := b.spans.Ended()
	if len(spans) != 1 || len(spans[0].Events()) == 0 {
		t.Fatalf("spans %v, want one with an error event", names(spans))
	}
	for _, ev := range spans[0].Events() {
		for _, kv := range ev.Attributes {
			if strings.Contains(kv.Value.Emit(), "SECRETKEY") {
				t.Errorf("submit span event %s attribute %s carries the key: %q", ev.Name, kv.Key, kv.Value.Emit())
			}
		}
	}
}

// Attack: a client sends a huge or malformed traceparent (and a huge
// tracestate). What Submit stores in Task.Trace is a well-formed W3C
// traceparent of at most 55 bytes, never the client's text; an attempt
// reading a garbage Task.Trace (written by anything) starts a new trace.
func TestAttackTraceparentFromClient(t *testing.T) {
	b := setup(t, otelidem.Config{})
	e := echo.New()
	e.Use(b.rec.Server())
	var stored []string
	e.POST("/v1/x", func(c echo.Context) error {
		_, err := b.rec.Submit(c.Request().Context(), pgstore.NewTask{Kind: "k"},
			func(_ context.Context, nt pgstore.NewTask) (pgstore.Task, error) {
				stored = append(stored, nt.Trace)
				return pgstore.Task{ID: "1"}, nil
			})
		return err
	})
	valid := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	headers := []string{
		strings.Repeat("a", 1<<16),
		"00-" + strings.Repeat("f", 32) + "-" + strings.Repeat("f", 16) + "-01", // all-f ids are valid hex
		"00-00000000000000000000000000000000-b7ad6b7169203331-01",               // zero trace id
		"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",               // forbidden version
		"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-" + strings.Repeat("x", 4096),
		valid + "\x00<script>",
		valid,
	}
	for _, h := range headers {
		req := httptest.NewRequest(http.MethodPost, "/v1/x", nil)
		req.Header.Set("traceparent", h)
		req.Header.Set("tracestate", strings.Repeat("k=v,", 10000))
		e.ServeHTTP(httptest.NewRecorder(), req)
	}
	if len(stored) != len(headers) {
		t.Fatalf("%d submits, want %d", len(stored), len(headers))
	}
	for i, tr := range stored {
		if len(tr) != 55 || strings.ContainsAny(tr, "<\x00x") {
			t.Errorf("header %d: stored trace %q, want a 55-byte traceparent", i, tr)
		}
	}
	if !strings.Contains(stored[len(stored)-1], "0af7651916cd43dd8448eb211c80319c") {
		t.Errorf("a valid traceparent did not continue the caller's trace: stored %q", stored[len(stored)-1])
	}

	h := b.rec.Attempt(func(ctx context.Context, _ pgstore.Task) pgstore.Outcome { return pgstore.Outcome{} })
	for i, tr := range []string{"", strings.Repeat("z", 1<<20), valid + "garbage", "00-zz-zz-zz"} {
		h(context.Background(), pgstore.Task{ID: fmt.Sprint("t", i), Kind: "k", Attempt: 1, Trace: tr})
	}
}

// Attack: the middleware on every route (e.Use), and a client that sends
// keyed POSTs to made-up paths (a 404 storm), under many tenants, users
// and keys, with different bodies for one key (conflicts). The request
// metrics stay at a handful of series per outcome and carry no path,
// key, tenant (not opted in) or user.
func TestAttackRequestMetricCardinality(t *testing.T) {
	b := setup(t, otelidem.Config{})
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	e := echo.New()
	e.Use(b.rec.Server())
	e.Use(middleware.New(middleware.Config{
		Store: b.rec.Store(middleware.NewRedisStore(rdb)),
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
	rm := b.collect(t)
	sets := map[attribute.Distinct]bool{}
	if d, ok := find(t, rm, "idemgate.requests").Data.(metricdata.Sum[int64]); ok {
		for _, p := range d.DataPoints {
			sets[p.Attributes.Equivalent()] = true
		}
	}
	if len(sets) == 0 || len(sets) > 8 {
		t.Errorf("idemgate.requests has %d series after 800 requests on 400 paths, want a handful", len(sets))
	}
	for _, kv := range allAttributes(rm) {
		if strings.Contains(kv.Value.Emit(), "SECRET") || kv.Key == "idemgate.tenant" {
			t.Errorf("metric attribute %s=%q carries client input", kv.Key, kv.Value.Emit())
		}
	}
	for _, s := range b.spans.Ended() {
		if strings.Contains(s.Name(), "SECRET") {
			t.Errorf("span name %q carries client input", s.Name())
		}
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.Emit(), "SECRET") {
				t.Errorf("span %s attribute %s=%q carries client input", s.Name(), kv.Key, kv.Value.Emit())
			}
		}
	}
}
