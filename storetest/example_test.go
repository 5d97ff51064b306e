package storetest_test

import (
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/redisstore"
	"github.com/idemgate/idemgate/storetest"
)

// newHarness returns the Redis store on a miniredis of its own, whose
// clock Advance moves, with a second client of the same server as Other.
// A store on a real server would pass time.Sleep and a lease of a few
// hundred milliseconds, and for RunDurability a server with persistence
// on (Redis appendonly, PostgreSQL as it is) that Restart kills and
// starts again on its files. miniredis keeps its data in memory across
// Restart.
func newHarness(t *testing.T) storetest.Harness {
	mr := miniredis.RunT(t)
	one := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	two := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { one.Close(); two.Close() })
	return storetest.Harness{
		Store:   redisstore.New(one),
		Other:   redisstore.New(two),
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

// A store's tests run the suite with a harness per case, and the
// durability check on a harness whose server serves nothing else.
func Example() {
	// In a _test.go file of your store's package:
	_ = func(t *testing.T) { // func TestStore(t *testing.T)
		storetest.Run(t, newHarness)
	}
	_ = func(t *testing.T) { // func TestStoreDurability(t *testing.T)
		storetest.RunDurability(t, newHarness)
	}
}
