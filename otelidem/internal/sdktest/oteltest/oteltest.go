// Package oteltest is the OpenTelemetry SDK as the tests of otelidem and
// otelpgstore use it: metrics read on demand with a ManualReader, spans
// kept in memory, and helpers that find a point by its attributes.
package oteltest

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// SDK is a meter provider and a tracer provider whose output a test reads.
type SDK struct {
	MeterProvider  *sdkmetric.MeterProvider
	TracerProvider *sdktrace.TracerProvider
	Reader         *sdkmetric.ManualReader
	Spans          *tracetest.SpanRecorder
}

// New returns an SDK that is shut down when the test ends.
func New(t testing.TB) *SDK {
	t.Helper()
	s := &SDK{Reader: sdkmetric.NewManualReader(), Spans: tracetest.NewSpanRecorder()}
	s.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(s.Reader))
	s.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(s.Spans))
	t.Cleanup(func() {
		_ = s.MeterProvider.Shutdown(context.Background())
		_ = s.TracerProvider.Shutdown(context.Background())
	})
	return s
}

// Collect reads every instrument once.
func (s *SDK) Collect(t testing.TB) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := s.Reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

// Has reports whether rm holds the metric called name (a synchronous
// instrument appears once it has recorded something).
func Has(rm metricdata.ResourceMetrics, name string) bool {
	_, ok := lookup(rm, name)
	return ok
}

// Find returns the metric called name, failing the test when it is absent.
func Find(t testing.TB, rm metricdata.ResourceMetrics, name string) metricdata.Metrics {
	t.Helper()
	m, ok := lookup(rm, name)
	if !ok {
		t.Fatalf("no metric %q", name)
	}
	return m
}

func lookup(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
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

// Count sums a counter's points, or a histogram's counts, whose attributes
// include want.
func Count(t testing.TB, rm metricdata.ResourceMetrics, name string, want ...attribute.KeyValue) int64 {
	t.Helper()
	var n int64
	switch d := Find(t, rm, name).Data.(type) {
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

// Value returns the value of the one point of an observable instrument
// (a gauge or an up-down counter) whose attributes include want, failing
// the test when there is none or more than one.
func Value(t testing.TB, rm metricdata.ResourceMetrics, name string, want ...attribute.KeyValue) float64 {
	t.Helper()
	var got []float64
	switch d := Find(t, rm, name).Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				got = append(got, float64(p.Value))
			}
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				got = append(got, float64(p.Value))
			}
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				got = append(got, p.Value)
			}
		}
	default:
		t.Fatalf("metric %q has data %T", name, d)
	}
	if len(got) != 1 {
		t.Fatalf("%d points of %s with %v, want 1", len(got), name, want)
	}
	return got[0]
}

// Points returns the attribute sets of every point of the metric called
// name; none when it is absent.
func Points(rm metricdata.ResourceMetrics, name string) []attribute.Set {
	m, ok := lookup(rm, name)
	if !ok {
		return nil
	}
	return pointSets(m)
}

func pointSets(m metricdata.Metrics) []attribute.Set {
	var out []attribute.Set
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	}
	return out
}

// Attributes returns every attribute of every point of every metric.
func Attributes(rm metricdata.ResourceMetrics) []attribute.KeyValue {
	var out []attribute.KeyValue
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			for _, s := range pointSets(m) {
				out = append(out, s.ToSlice()...)
			}
		}
	}
	return out
}

// Names returns the names of spans.
func Names(spans []sdktrace.ReadOnlySpan) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name()
	}
	return out
}

// Attr returns the value of sp's attribute key as text; "" when absent.
func Attr(sp sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range sp.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}
