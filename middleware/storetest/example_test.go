package storetest_test

import (
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/middleware/storetest"
)

// A store's test runs the suite with a harness per case. Here the Redis
// store on miniredis, whose clock the harness moves; a store on a real
// server would pass time.Sleep and a lease of a few hundred milliseconds.
func ExampleRun() {
	// In a _test.go file of your store's package:
	_ = func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) storetest.Harness {
			mr := miniredis.RunT(t)
			client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			t.Cleanup(func() { client.Close() })
			return storetest.Harness{
				Store:   middleware.NewRedisStore(client),
				Advance: mr.FastForward,
				Lease:   30 * time.Second,
			}
		})
	}
}

// TestRunOnMiniredis runs the suite as the example shows.
func TestRunOnMiniredis(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		mr := miniredis.RunT(t)
		client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { client.Close() })
		return storetest.Harness{Store: middleware.NewRedisStore(client), Advance: mr.FastForward, Lease: 30 * time.Second}
	})
}
