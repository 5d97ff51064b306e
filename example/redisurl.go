package main

import (
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/internal/redisurl"
)

// parseRedisURL reads REDIS_URL: one node, a cluster (several seeds) or
// Sentinel (master_name=); the idemgate command reads the same URLs (see
// redisurl.Parse, whose tests and fuzz target cover them).
func parseRedisURL(s string) (*redis.UniversalOptions, redisurl.Topology, error) {
	return redisurl.Parse(s)
}
