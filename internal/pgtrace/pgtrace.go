// Package pgtrace counts the round trips a pgx pool makes, for benchmarks
// and load tools that report round trips per request.
package pgtrace

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// RoundTrips is a pgx tracer that counts round trips: each query, each
// batch (however many statements it holds) and each COPY. Transaction
// statements (BEGIN, COMMIT, …) are queries too. Set it as a pool's
// ConnConfig.Tracer. Its methods are safe for concurrent use.
type RoundTrips struct{ n atomic.Int64 }

var (
	_ pgx.QueryTracer    = (*RoundTrips)(nil)
	_ pgx.BatchTracer    = (*RoundTrips)(nil)
	_ pgx.CopyFromTracer = (*RoundTrips)(nil)
)

// Load returns the round trips counted so far; 0 for a nil r.
func (r *RoundTrips) Load() int64 {
	if r == nil {
		return 0
	}
	return r.n.Load()
}

// TraceQueryStart counts a query.
func (r *RoundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}

// TraceQueryEnd does nothing.
func (r *RoundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart counts a batch as one round trip.
func (r *RoundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}

// TraceBatchQuery does nothing: the batch was counted once.
func (r *RoundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd does nothing.
func (r *RoundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TraceCopyFromStart counts a COPY.
func (r *RoundTrips) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceCopyFromStartData) context.Context {
	r.n.Add(1)
	return ctx
}

// TraceCopyFromEnd does nothing.
func (r *RoundTrips) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}
