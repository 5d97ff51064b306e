package doortest

import (
	"net"
	"testing"
	"time"

	"github.com/idemgate/idemgate/redisstore"
	"github.com/redis/go-redis/v9"
)

// testStoreUnavailable: a store that cannot be reached is 503
// store_unavailable (fail closed), and with FailOpen the handler runs
// unprotected.
func testStoreUnavailable(t *testing.T, b bundle) {
	tests := []struct {
		name     string
		failOpen bool
		want     want
	}{
		{name: "it is store_unavailable", want: want{status: 503, code: "store_unavailable", events: "store_error(claim)"}},
		{name: "with FailOpen the handler runs", failOpen: true, want: want{status: 201, calls: 1, events: "store_error(claim),fail_open"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			client := redis.NewClient(&redis.Options{Addr: closedAddr(t), MaxRetries: -1, DialTimeout: time.Second})
			t.Cleanup(func() { client.Close() })
			s := b.serve(t, func(c *Config) { c.Store = redisstore.New(client); c.FailOpen = tt.failOpen }, nil)
			tt.want.check(t, s, s.do(t, req{key: "k", body: imageBody}))
		})
	}
}

// closedAddr returns a loopback address that refuses connections.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
