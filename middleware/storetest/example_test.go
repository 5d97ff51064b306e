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
// store on miniredis, whose clock the harness moves, with a second client
// on the same server as Other; a store on a real server would pass
// time.Sleep and a lease of a few hundred milliseconds.
func ExampleRun() {
	// In a _test.go file of your store's package:
	_ = func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) storetest.Harness {
			mr := miniredis.RunT(t)
			one := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			two := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			t.Cleanup(func() { one.Close(); two.Close() })
			return storetest.Harness{
				Store:   middleware.NewRedisStore(one),
				Other:   middleware.NewRedisStore(two),
				Advance: mr.FastForward,
				Lease:   30 * time.Second,
			}
		})
	}
}

// The durability check needs a server of its own, which Restart restarts
// on the same data. miniredis keeps its data in memory across Restart; a
// real server would be started with persistence on (Redis appendonly,
// PostgreSQL as it is) and restarted from its files.
func ExampleRunDurability() {
	// In a _test.go file of your store's package:
	_ = func(t *testing.T) {
		storetest.RunDurability(t, func(t *testing.T) storetest.Harness {
			mr := miniredis.RunT(t)
			one := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			two := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			t.Cleanup(func() { one.Close(); two.Close() })
			return storetest.Harness{
				Store:   middleware.NewRedisStore(one),
				Other:   middleware.NewRedisStore(two),
				Advance: mr.FastForward,
				Lease:   30 * time.Second,
				Restart: func(t *testing.T) {
					mr.Close()
					if err := mr.Restart(); err != nil {
						t.Fatalf("restart miniredis: %v", err)
					}
				},
			}
		})
	}
}

// TestRunOnMiniredis runs the suite as the examples show.
func TestRunOnMiniredis(t *testing.T) {
	newHarness := func(t *testing.T) storetest.Harness {
		mr := miniredis.RunT(t)
		one := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		two := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { one.Close(); two.Close() })
		return storetest.Harness{
			Store:   middleware.NewRedisStore(one),
			Other:   middleware.NewRedisStore(two),
			Advance: mr.FastForward,
			Lease:   30 * time.Second,
			Restart: func(t *testing.T) {
				mr.Close()
				if err := mr.Restart(); err != nil {
					t.Fatalf("restart miniredis: %v", err)
				}
			},
		}
	}
	t.Run("Run", func(t *testing.T) { storetest.Run(t, newHarness) })
	t.Run("RunDurability", func(t *testing.T) { storetest.RunDurability(t, newHarness) })
}
