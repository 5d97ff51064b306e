// Package wait polls a condition in tests. It asserts that an event
// happens, never how long it takes: the bound is generous so that a test
// holds on a loaded machine, and the poll returns as soon as the condition
// holds.
package wait

import (
	"testing"
	"time"
)

// Interval is the pause between two polls.
const Interval = 5 * time.Millisecond

// Until polls cond until it holds or within has passed, and reports whether
// it held. It never fails a test, so goroutines other than the test's may
// call it.
func Until(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(Interval)
	}
	return true
}

// For polls cond until it holds, and fails the test with what if it has not
// held within the bound.
func For(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Until(within, cond) {
		t.Fatalf("not within %v: %s", within, what)
	}
}
