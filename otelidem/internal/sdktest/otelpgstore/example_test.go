package otelpgstore_test

import (
	"context"
	"fmt"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemgate/idemgate/otelidem/otelpgstore"
	"github.com/idemgate/idemgate/pgstore"
)

// A worker's events become idemgate.task.attempts by outcome. A service
// sets rec.OnWorkerEvent as pgstore.WorkerConfig.OnEvent; here three
// events are recorded by hand and read back with the SDK's ManualReader.
func Example() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	rec, err := otelpgstore.New(otelpgstore.Config{MeterProvider: mp})
	if err != nil {
		panic(err)
	}
	rec.OnWorkerEvent(pgstore.WorkerEvent{Type: pgstore.WorkerSucceeded, Kind: "images", TaskID: "1", Attempt: 1, Latency: time.Second})
	rec.OnWorkerEvent(pgstore.WorkerEvent{Type: pgstore.WorkerRetried, Kind: "images", TaskID: "2", Attempt: 1, Latency: time.Second})
	rec.OnWorkerEvent(pgstore.WorkerEvent{Type: pgstore.WorkerSucceeded, Kind: "images", TaskID: "2", Attempt: 2, Latency: time.Second})

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name != "idemgate.task.attempts" {
			continue
		}
		for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
			kind, _ := p.Attributes.Value("idemgate.task.kind")
			outcome, _ := p.Attributes.Value("idemgate.task.outcome")
			fmt.Println(kind.AsString(), outcome.AsString(), p.Value)
		}
	}
	// Unordered output:
	// images succeeded 2
	// images retried 1
}
