package otelidem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/otelidem"
	"github.com/idemgate/idemgate/otelidem/internal/sdktest/oteltest"
)

// TestStoreSpans checks that the store calls are children of the request's
// span, which continues the caller's trace.
func TestStoreSpans(t *testing.T) {
	b := setup(t, otelidem.Config{})
	s := newService(t, b)
	if rec := s.post("poster:launch:1", "a lighthouse"); rec.Code != http.StatusAccepted {
		t.Fatalf("status %d", rec.Code)
	}
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, sp := range b.Spans.Ended() {
		byName[sp.Name()] = sp
	}
	server, ok := byName["POST /v1/images"]
	if !ok {
		t.Fatalf("no server span; spans: %v", oteltest.Names(b.Spans.Ended()))
	}
	if got := server.SpanContext().TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("server span trace %s does not continue the caller's", got)
	}
	for _, name := range []string{"idemgate.claim", "idemgate.complete"} {
		sp, ok := byName[name]
		if !ok {
			t.Fatalf("no %s span; spans: %v", name, oteltest.Names(b.Spans.Ended()))
		}
		if sp.Parent().SpanID() != server.SpanContext().SpanID() {
			t.Errorf("%s parent = %s, want the server span %s", name, sp.Parent().SpanID(), server.SpanContext().SpanID())
		}
		for _, kv := range sp.Attributes() {
			if strings.Contains(kv.Value.String(), "poster:launch") {
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

// leakyStore fails every call with an error that names the key, as a
// hand-written store may.
type leakyStore struct{}

func (leakyStore) Claim(_ context.Context, key string, _ idemgate.ClaimRequest) (idemgate.ClaimResult, error) {
	return idemgate.ClaimResult{}, fmt.Errorf("leaky: claim %s: %w", key, errors.New("down"))
}
func (leakyStore) Extend(_ context.Context, key string, _ idemgate.Token, _ time.Duration) error {
	return fmt.Errorf("leaky: extend %s", key)
}
func (leakyStore) Complete(_ context.Context, key string, _ idemgate.Token, _ idemgate.Response, _ time.Duration) error {
	return fmt.Errorf("leaky: complete %s", key)
}
func (leakyStore) Release(_ context.Context, key string, _ idemgate.Token) error {
	return fmt.Errorf("leaky: release %s", key)
}

// TestStoreErrorKeepsKeyOutOfSpan: the store's error names the key. The
// store span records the error; the key must not reach the span
// (attributes or events).
func TestStoreErrorKeepsKeyOutOfSpan(t *testing.T) {
	b := setup(t, otelidem.Config{})
	s := b.rec.Store(leakyStore{})
	const key = "tenant-acme/user-alice/SECRETKEY-123"
	_, _ = s.Claim(context.Background(), key, idemgate.ClaimRequest{})
	_ = s.Extend(context.Background(), key, idemgate.Token{}, time.Second)
	_ = s.Complete(context.Background(), key, idemgate.Token{}, idemgate.Response{}, time.Second)
	_ = s.Release(context.Background(), key, idemgate.Token{})
	spans := b.Spans.Ended()
	if len(spans) != 4 {
		t.Fatalf("%d spans, want 4", len(spans))
	}
	for _, sp := range spans {
		if sp.Status().Code.String() != "Error" {
			t.Errorf("span %s status %v, want Error", sp.Name(), sp.Status())
		}
		for _, kv := range sp.Attributes() {
			if strings.Contains(kv.Value.String(), "SECRETKEY") {
				t.Errorf("span %s attribute %s carries the key", sp.Name(), kv.Key)
			}
		}
		if len(sp.Events()) == 0 {
			t.Errorf("span %s recorded no error event", sp.Name())
		}
		for _, ev := range sp.Events() {
			for _, kv := range ev.Attributes {
				if strings.Contains(kv.Value.String(), "SECRETKEY") {
					t.Errorf("span %s event %s attribute %s carries the key: %q", sp.Name(), ev.Name, kv.Key, kv.Value.String())
				}
			}
		}
	}
}
