//go:build race

package fingerprint

// raceEnabled: the race detector makes sync.Pool drop items on purpose.
const raceEnabled = true
