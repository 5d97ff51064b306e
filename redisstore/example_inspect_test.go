package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/keyspace"
	"github.com/idemgate/idemgate/redisstore"
)

// An operator frees a claim whose request hangs, so that the client's
// retry runs; the hung request can no longer store its answer.
func ExampleStore_Inspect() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	var store idemgate.Store = redisstore.New(redis.NewClient(&redis.Options{Addr: mr.Addr()}))
	ctx := context.Background()

	key, _ := keyspace.Derive("images", keyspace.Scope{Tenant: "acme", User: "alice", Request: "order-7731"})
	hung := idemgate.Token{1}
	_, _ = store.Claim(ctx, key.String(), idemgate.ClaimRequest{Fingerprint: "v1:fp", Owner: key.Owner(),
		Kind: key.Kind(), Lease: time.Minute, Token: hung})

	insp, ok := store.(idemgate.Inspector) // optional: a Store of one's own need not be one
	if !ok {
		return
	}
	info, _ := insp.Inspect(ctx, key.String())
	fmt.Println("finished:", info.Finished, "lease left:", info.Left)
	fmt.Println("forget:", insp.Forget(ctx, key.String(), info.Token, info.Finished))
	err := store.Complete(ctx, key.String(), hung, idemgate.Response{Status: 200}, time.Hour)
	fmt.Println("the hung request's answer:", errors.Is(err, idemgate.ErrLeaseLost))
	// Output:
	// finished: false lease left: 1m0s
	// forget: <nil>
	// the hung request's answer: true
}
