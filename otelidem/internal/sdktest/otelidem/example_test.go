package otelidem_test

import (
	"context"
	"fmt"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/otelidem"
)

// The middleware's events become idemgate.requests by outcome. A service
// sets rec.OnEvent as middleware.Config.OnEvent; here two events are
// recorded by hand and read back with the SDK's ManualReader.
func Example() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	rec, err := otelidem.New(otelidem.Config{MeterProvider: mp})
	if err != nil {
		panic(err)
	}
	rec.OnEvent(context.Background(), idemgate.Event{Type: idemgate.EventClaimed, Route: "POST /v1/images", Kind: "images", Latency: time.Millisecond})
	rec.OnEvent(context.Background(), idemgate.Event{Type: idemgate.EventReplayed, Route: "POST /v1/images", Kind: "images", Latency: time.Millisecond})

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name != "idemgate.requests" {
			continue
		}
		for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
			outcome, _ := p.Attributes.Value("idemgate.outcome")
			route, _ := p.Attributes.Value("http.route")
			fmt.Println(outcome.AsString(), route.AsString(), p.Value)
		}
	}
	// Unordered output:
	// claimed /v1/images 1
	// replayed /v1/images 1
}
