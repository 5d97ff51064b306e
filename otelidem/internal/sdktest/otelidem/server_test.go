package otelidem_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/otelidem"
	"github.com/idemgate/idemgate/otelidem/internal/sdktest/oteltest"
)

// TestServerSpanContinuesCaller: the server span continues the caller's
// traceparent, is named after the route (not the path) and carries the
// status the client got, echo's error handler included.
func TestServerSpanContinuesCaller(t *testing.T) {
	b := setup(t, otelidem.Config{})
	e := echo.New()
	e.Use(b.rec.Server())
	e.GET("/v1/items/:id", func(c echo.Context) error { return echo.NewHTTPError(http.StatusBadGateway) })
	req := httptest.NewRequest(http.MethodGet, "/v1/items/42", nil)
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, req)
	if rec.Code != http.StatusBadGateway {
		t.Fatalf("status %d, want 502", rec.Code)
	}
	spans := b.Spans.Ended()
	if len(spans) != 1 {
		t.Fatalf("spans %v, want one", oteltest.Names(spans))
	}
	sp := spans[0]
	if sp.Name() != "GET /v1/items/:id" {
		t.Errorf("span name %q, want the route", sp.Name())
	}
	if got := sp.SpanContext().TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("trace %s does not continue the caller's", got)
	}
	if got := sp.Parent().SpanID().String(); got != "00f067aa0ba902b7" {
		t.Errorf("parent %s, want the caller's span", got)
	}
	if got := oteltest.Attr(sp, "http.response.status_code"); got != "502" {
		t.Errorf("status code attribute %q, want 502", got)
	}
	if sp.Status().Code.String() != "Error" {
		t.Errorf("span status %v, want Error for a 5xx", sp.Status())
	}
}

// TestServerSpanUnknownMethod: a client sends made-up request methods. The
// server span's name and its http.request.method attribute must not carry
// them (a span name per made-up method; OTel's HTTP conventions map
// unknown methods to _OTHER), nor the path of a route that does not exist.
func TestServerSpanUnknownMethod(t *testing.T) {
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
	spans := b.Spans.Ended()
	if len(spans) != 40 {
		t.Fatalf("%d spans, want 40", len(spans))
	}
	for _, s := range spans {
		if strings.Contains(s.Name(), "SECRET") || strings.Contains(s.Name(), "/nope/") {
			t.Errorf("span name %q carries a client-chosen method or path", s.Name())
		}
		for _, kv := range s.Attributes() {
			if v := kv.Value.String(); strings.Contains(v, "SECRET") || strings.Contains(v, "/nope/") {
				t.Errorf("span %q attribute %s=%q carries a client-chosen value", s.Name(), kv.Key, v)
			}
		}
	}
}

// TestServerWithSkipper: a skipped request gets no span and still runs.
func TestServerWithSkipper(t *testing.T) {
	b := setup(t, otelidem.Config{})
	e := echo.New()
	e.Use(b.rec.ServerWithSkipper(func(c echo.Context) bool { return c.Path() == "/healthz" }))
	e.GET("/healthz", func(c echo.Context) error { return c.NoContent(http.StatusNoContent) })
	e.GET("/v1/x", func(c echo.Context) error { return c.NoContent(http.StatusNoContent) })
	for _, path := range []string{"/healthz", "/v1/x"} {
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusNoContent {
			t.Fatalf("%s: status %d", path, rec.Code)
		}
	}
	if got := oteltest.Names(b.Spans.Ended()); len(got) != 1 || got[0] != "GET /v1/x" {
		t.Errorf("spans %v, want only GET /v1/x", got)
	}
}
