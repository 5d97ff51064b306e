//go:build race

package middleware

// raceEnabled: the test binary runs under the race detector.
const raceEnabled = true
