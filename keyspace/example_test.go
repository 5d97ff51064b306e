package keyspace_test

import (
	"errors"
	"fmt"

	"github.com/idemgate/idemgate/keyspace"
)

func ExampleDerive() {
	k, err := keyspace.Derive("image", keyspace.Scope{
		Tenant:  "Acme: EU",
		User:    "user-42",
		Request: "order-1001:generate",
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(k.Tenant())
	fmt.Println(k.Kind())
	fmt.Println(k)
	fmt.Println(k.Task())

	_, err = keyspace.Derive("image", keyspace.Scope{Tenant: "acme", User: "user-42", Request: "line\nbreak"})
	fmt.Println(errors.Is(err, keyspace.ErrInvalid), err)
	// Output:
	// Acme%3A%20EU
	// image
	// idem:Acme%3A%20EU:image:6d894aa3ee802549d7f340e7c1cf0d1c1cb14cd84f768d92ffaa6785337c4997:42283e9901382ed79d4c9f550c7afd2957fdf95486da800e84a22d1c5a10d04b
	// image:7343fb4964f2e5eaa0efbe362ef899985a495f4f8a7a17f9a8e55d277aaf2baa
	// true keyspace: request id has byte 0x0A at offset 4, want printable ASCII 0x20-0x7E: invalid key input
}

func ExampleNormalizeSegment() {
	fmt.Println(keyspace.NormalizeSegment("acme-01.prod_x"))
	fmt.Println(keyspace.NormalizeSegment("a:b"))
	fmt.Println(keyspace.NormalizeSegment("a%3Ab"))
	fmt.Println(keyspace.NormalizeSegment("{eu} Zürich"))
	// Output:
	// acme-01.prod_x
	// a%3Ab
	// a%253Ab
	// %7Beu%7D%20Z%C3%BCrich
}

func ExampleKindFor() {
	fmt.Println(keyspace.KindFor("POST", "/v1/images"))
	// ':' has no place in a kind: a digest keeps the route apart from
	// POST /v1/orders/id/refund.
	fmt.Println(keyspace.KindFor("POST", "/v1/orders/:id/refund"))
	// Output:
	// post-v1-images
	// post-v1-orders-id-refund-ef73619e
}
