package redisstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/redisstore"
)

// A store is shared by every node of a service: the first claim of a key
// wins, the response is stored under it, and a later claim with the same
// fingerprint gets that response back.
func Example() {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	store := redisstore.New(rdb)

	ctx := context.Background()
	req := idemgate.ClaimRequest{Fingerprint: "v1:charge-42", Owner: "user-1", Kind: "charge", Lease: time.Minute, Token: idemgate.Token{1}}
	first, err := store.Claim(ctx, "idem:acme:charge:42", req)
	if err != nil {
		panic(err)
	}
	fmt.Println("first:", first.Status)
	if err := store.Complete(ctx, "idem:acme:charge:42", req.Token, idemgate.Response{Status: 201, Body: []byte(`{"id":42}`)}, 24*time.Hour); err != nil {
		panic(err)
	}

	req.Token = idemgate.Token{2} // a retry, from another node
	again, err := store.Claim(ctx, "idem:acme:charge:42", req)
	if err != nil {
		panic(err)
	}
	fmt.Println("again:", again.Status, again.Response.Status, string(again.Response.Body))
	// Output:
	// first: claimed
	// again: finished 201 {"id":42}
}
