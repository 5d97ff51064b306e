package otelidem_test

import (
	"testing"
	"time"

	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/otelidem"
	"github.com/idemgate/idemgate/pgstore"
)

// BenchmarkOnEvent is the cost a request pays for its metrics, on the SDK.
func BenchmarkOnEvent(b *testing.B) {
	bu := setup(b, otelidem.Config{})
	ev := middleware.Event{Type: middleware.EventClaimed, Route: "POST /v1/images", Kind: "images", Tenant: "acme", Latency: time.Millisecond}
	b.ReportAllocs()
	for b.Loop() {
		bu.rec.OnEvent(ev)
	}
}

// BenchmarkOnWorkerEvent is the cost of one attempt's outcome metrics.
func BenchmarkOnWorkerEvent(b *testing.B) {
	bu := setup(b, otelidem.Config{})
	ev := pgstore.WorkerEvent{Type: pgstore.WorkerSucceeded, Kind: "images", TaskID: "t", Attempt: 1, Latency: time.Second}
	b.ReportAllocs()
	for b.Loop() {
		bu.rec.OnWorkerEvent(ev)
	}
}
