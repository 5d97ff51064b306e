package redisstore_test

import (
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/internal/inspecttest"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/redisstore"
)

func TestRedisStoreInspector(t *testing.T) {
	t.Parallel()
	for name, opts := range map[string]func(t *testing.T) *redis.Options{
		"redis-server": func(t *testing.T) *redis.Options { return testenv.Redis(t) },
		"miniredis":    func(t *testing.T) *redis.Options { return &redis.Options{Addr: miniredis.RunT(t).Addr()} },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			inspecttest.Run(t, func(t *testing.T) inspecttest.Store {
				c := redis.NewClient(opts(t))
				t.Cleanup(func() { _ = c.Close() })
				return redisstore.New(c)
			})
		})
	}
}

func TestRedisStoreInspectorOnCluster(t *testing.T) {
	t.Parallel()
	inspecttest.Run(t, func(t *testing.T) inspecttest.Store {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.RedisCluster(t)})
		t.Cleanup(func() { _ = c.Close() })
		return redisstore.New(c)
	})
}
