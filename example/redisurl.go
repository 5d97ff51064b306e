package main

import (
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/internal/redisurl"
)

// redisTopology is what a REDIS_URL names; the idemgate command reads the
// same URLs (internal/redisurl).
type redisTopology = redisurl.Topology

const (
	redisSingle   = redisurl.Single
	redisCluster  = redisurl.Cluster
	redisSentinel = redisurl.Sentinel
)

// parseRedisURL reads REDIS_URL: one node, a cluster (several seeds) or
// Sentinel (master_name=); see redisurl.Parse.
func parseRedisURL(s string) (*redis.UniversalOptions, redisTopology, error) {
	return redisurl.Parse(s)
}
