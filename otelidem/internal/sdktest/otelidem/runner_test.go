package otelidem_test

import (
	"context"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/keyspace"
	"github.com/idemgate/idemgate/otelidem"
	"github.com/idemgate/idemgate/otelidem/internal/sdktest/oteltest"
	"github.com/idemgate/idemgate/redisstore"
)

// Runner.Do's events are recorded as a request's, by kind and outcome; a
// Do event has no route (its Route is empty), so its points carry neither
// http.request.method nor http.route, rather than a made-up method.
func TestRunnerDoEventsAreRecordedWithoutHTTPAttributes(t *testing.T) {
	b := setup(t, otelidem.Config{})
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	r := idemgate.Runner{Store: b.rec.Store(redisstore.New(rdb)), Kind: "charge", OnEvent: b.rec.OnEvent}
	scope := keyspace.Scope{Tenant: "acme", User: "billing-worker", Request: "msg-1"}
	for range 2 {
		if _, err := r.Do(context.Background(), scope, []byte(`{"amount":100}`), func(context.Context) ([]byte, error) {
			return []byte("ok"), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	rm := b.Collect(t)
	for _, outcome := range []string{"claimed", "replayed"} {
		if got := oteltest.Count(t, rm, "idemgate.requests", attribute.String("idemgate.outcome", outcome),
			attribute.String("idemgate.kind", "charge")); got != 1 {
			t.Errorf("idemgate.requests{outcome=%s,kind=charge} = %d, want 1", outcome, got)
		}
	}
	for _, set := range oteltest.Points(rm, "idemgate.requests") {
		for _, key := range []attribute.Key{"http.request.method", "http.route"} {
			if v, ok := set.Value(key); ok {
				t.Errorf("a Do point carries %s=%q", key, v.String())
			}
		}
	}
	if got := oteltest.Count(t, rm, "idemgate.store.duration", attribute.String("idemgate.operation", "complete")); got != 1 {
		t.Errorf("idemgate.store.duration{operation=complete} count = %d, want 1", got)
	}
}
