//go:build race

package redisstore

// raceEnabled: the test binary runs under the race detector.
const raceEnabled = true
