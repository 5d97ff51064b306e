//go:build race

package proctest

// raceEnabled reports whether this binary runs with the race detector.
const raceEnabled = true
