package main

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/internal/testenv"
)

// TestRoundTripsIgnoreHandshake: a new connection's handshake (HELLO,
// CLIENT SETINFO, SELECT) is not a request's round trip.
func TestRoundTripsIgnoreHandshake(t *testing.T) {
	ro := testenv.Redis(t)
	rt := &roundTrips{}
	c := redis.NewClient(&redis.Options{Addr: ro.Addr, DB: ro.DB, PoolSize: 4})
	defer c.Close()
	c.AddHook(rt)
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Get(ctx, "a")
		p.Get(ctx, "b")
		return nil
	}); err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	if got := rt.n.Load(); got != 2 {
		t.Fatalf("counted %d round trips for one PING and one pipeline on a new connection, want 2", got)
	}
}
