package idemgate

import (
	"context"
	"strconv"
	"testing"

	"github.com/idemgate/idemgate/keyspace"
)

// BenchmarkRunnerDo is Runner.Do's own cost over a store in memory: a
// first run (claim, fn, complete) and a replay. Do builds its Engine on
// every call (a Runner is a plain value).
func BenchmarkRunnerDo(b *testing.B) {
	params := []byte(`{"amount":100,"currency":"EUR"}`)
	fn := func(context.Context) ([]byte, error) { return []byte("ok"), nil }
	b.Run("first", func(b *testing.B) {
		r := Runner{Store: newMemStore(), Kind: "charge"}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := r.Do(context.Background(), keyspace.Scope{Tenant: "acme", User: "w", Request: strconv.Itoa(i)}, params, fn); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		r := Runner{Store: newMemStore(), Kind: "charge"}
		s := keyspace.Scope{Tenant: "acme", User: "w", Request: "1"}
		if _, err := r.Do(context.Background(), s, params, fn); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if res, err := r.Do(context.Background(), s, params, fn); err != nil || !res.Replayed {
				b.Fatal(res, err)
			}
		}
	})
}
