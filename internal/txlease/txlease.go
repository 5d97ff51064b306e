// Package txlease carries a route's lease to TxStore.Begin in its context,
// between the engine, which sets it, and idemgate.TxLease, which reads it.
package txlease

import (
	"context"
	"time"
)

type key struct{}

// With returns ctx carrying lease.
func With(ctx context.Context, lease time.Duration) context.Context {
	return context.WithValue(ctx, key{}, lease)
}

// From returns the lease ctx carries.
func From(ctx context.Context) (time.Duration, bool) {
	d, ok := ctx.Value(key{}).(time.Duration)
	return d, ok
}
