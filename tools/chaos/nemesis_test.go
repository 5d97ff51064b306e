package main

import (
	"io"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// TestInjectRunsAFaultWhoseWindowShrankUnderMinFault: deal saw time for a
// fault, and by the time inject looks (a loaded machine) less than
// minFault is left: the fault still runs, or the first round misses a
// kind and the smoke's "every kind injected" fails on a slow machine.
func TestInjectRunsAFaultWhoseWindowShrankUnderMinFault(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	flush := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer flush.Close()
	if err := flush.Set(t.Context(), "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	n := &nemesis{rec: newRecorder(io.Discard), flush: flush, log: func(string, ...any) {}}
	n.inject(t.Context(), "flushall", time.Now().Add(minFault/3))
	if got := len(n.rec.h.Faults); got != 1 {
		t.Fatalf("%d faults recorded, want the flushall dealt", got)
	}
	if mr.Exists("k") {
		t.Errorf("the key is still there: no FLUSHALL ran")
	}
}
