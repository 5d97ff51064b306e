package otelidem_test

import (
	"encoding/hex"
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemgate/idemgate/otelidem"
	"github.com/idemgate/idemgate/otelidem/internal/sdktest/oteltest"
)

// TestEventExemplarNamesTheRequestTrace: the middleware hands OnEvent the
// request's context, and the Recorder records with it, so the SDK's
// exemplar of a request's idemgate.requests point names the request's
// trace and span (the caller's traceparent, continued by Server). Recorded
// with context.Background(), a measurement had no trace to link.
func TestEventExemplarNamesTheRequestTrace(t *testing.T) {
	b := setup(t, otelidem.Config{})
	s := newService(t, b)
	if rec := s.post("poster:launch:1", "a lighthouse"); rec.Code != http.StatusAccepted {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	var server string // the request's server span, which the event's context carries
	for _, sp := range b.Spans.Ended() {
		if sp.Name() == "POST /v1/images" {
			server = sp.SpanContext().SpanID().String()
		}
	}
	if server == "" {
		t.Fatal("no server span")
	}
	m := oteltest.Find(t, b.Collect(t), "idemgate.requests")
	claimed := attribute.String("idemgate.outcome", "claimed")
	found := false
	for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
		if v, _ := p.Attributes.Value(claimed.Key); v != claimed.Value {
			continue
		}
		for _, ex := range p.Exemplars {
			found = true
			if got := hex.EncodeToString(ex.TraceID); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
				t.Errorf("exemplar trace %s, want the request's 4bf92f3577b34da6a3ce929d0e0e4736", got)
			}
			if got := hex.EncodeToString(ex.SpanID); got != server {
				t.Errorf("exemplar span %s, want the request's server span %s", got, server)
			}
		}
	}
	if !found {
		t.Error("the claimed point has no exemplar: the event was recorded without the request's context")
	}
}
