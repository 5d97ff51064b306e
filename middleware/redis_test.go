package middleware_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/internal/storetest"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/middleware"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

func TestRedisStoreMiniredis(t *testing.T) {
	t.Parallel()
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

// realLease is long enough for a loaded 2-core machine to answer within it,
// short enough to sleep through.
const realLease = 600 * time.Millisecond

func TestRedisStoreServer(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		client := redis.NewClient(testenv.Redis(t))
		t.Cleanup(func() { client.Close() })
		return storetest.Harness{Store: middleware.NewRedisStore(client), Advance: time.Sleep, Lease: realLease}
	})
}

// TestRedisStoreCluster runs the suite on a 3-node Redis Cluster: every
// script touches one key, so none fails with CROSSSLOT, and the random keys
// land on all three nodes.
func TestRedisStoreCluster(t *testing.T) {
	t.Parallel()
	addrs := testenv.RedisCluster(t)
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		t.Cleanup(func() { client.Close() })
		return storetest.Harness{Store: middleware.NewRedisStore(client), Advance: time.Sleep, Lease: realLease}
	})

	// The keys of one run really spread over the nodes.
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer client.Close()
	store := middleware.NewRedisStore(client)
	ctx := context.Background()
	nodes := map[string]bool{}
	for range 32 {
		key := storetest.Key(t)
		if _, err := store.Claim(ctx, key, middleware.ClaimRequest{Fingerprint: "v1:x", Owner: "o", Kind: "k", Lease: time.Second}); err != nil {
			t.Fatalf("Claim on the cluster: %v", err)
		}
		shard, err := client.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		nodes[shard.Options().Addr] = true
	}
	if len(nodes) < 2 {
		t.Errorf("32 keys landed on %d node(s); the cluster test proves nothing", len(nodes))
	}
}
