//go:build review

package pgstore

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// A fractional rate (0.1/s) has a burst of one start; setting the limits
// again (the same rate, a pause and resume, another MaxRunning) gives no
// extra tokens; a raised rate fills at the new rate, from what is left.
func TestReviewFractionalRateAndMidBucketChanges(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	for i := range 20 {
		mustSubmit(t, s, tenantTask(fmt.Sprintf("t%d", i%3), fmt.Sprintf("rate-%d", i)))
	}
	set := func(l KindLimits) {
		t.Helper()
		if err := s.SetKindLimits(ctx, "image", l); err != nil {
			t.Fatal(err)
		}
	}
	claim := func() int { return len(claimNow(t, s, []string{"image"}, 10)) }
	set(KindLimits{StartsPerSecond: 0.1})
	if n := claim(); n != 1 {
		t.Fatalf("first claim at 0.1/s: %d starts; want the burst of 1", n)
	}
	for _, l := range []KindLimits{{StartsPerSecond: 0.1}, {StartsPerSecond: 0.1, Paused: true},
		{StartsPerSecond: 0.1}, {StartsPerSecond: 0.1, MaxRunning: 100}, {StartsPerSecond: 0.1, MaxRunningPerTenant: 5}} {
		set(l)
		if n := claim(); n != 0 {
			t.Fatalf("after SetKindLimits(%+v): %d starts; the bucket was empty", l, n)
		}
	}
	set(KindLimits{StartsPerSecond: 4})
	if n := claim(); n != 0 {
		t.Fatalf("raised to 4/s from an empty bucket: %d starts at once; want none yet", n)
	}
	time.Sleep(600 * time.Millisecond)
	if n := claim(); n < 2 || n > 3 {
		t.Fatalf("600ms at 4/s: %d starts; want 2", n)
	}
	time.Sleep(3 * time.Second)
	if n := claim(); n != 4 {
		t.Fatalf("3s idle at 4/s: %d starts; want the burst of 4", n)
	}
}
