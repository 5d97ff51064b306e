//go:build review

package pgstore

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// turnOf gives a tenant's first task "the line's next turn": the lowest
// turn among waiting tasks. Waiting includes tasks not yet due (RunAfter
// in the future, a retry's long backoff), whose turn was given when the
// line was far behind. One such task pins "the next turn" in the past:
// every newcomer's backlog then takes turns 0, 1, 2, … and runs entirely
// before the established tenants' next turns, instead of taking turns
// with them.
func TestReviewFutureTaskDoesNotPinTheLine(t *testing.T) {
	t.Parallel()
	for _, pinned := range []bool{false, true} {
		t.Run(fmt.Sprintf("future task %v", pinned), func(t *testing.T) {
			t.Parallel()
			s, _ := setup(t)
			ctx := context.Background()
			if pinned {
				later := tenantTask("scheduler", "tomorrow")
				later.RunAfter = time.Now().Add(time.Hour)
				mustSubmit(t, s, later)
			}
			var a []NewTask
			for i := range 200 {
				a = append(a, tenantTask("tenant-a", fmt.Sprintf("a-%d", i)))
			}
			if _, err := s.SubmitMany(ctx, a); err != nil {
				t.Fatal(err)
			}
			if got := claimNow(t, s, []string{"image"}, 100); len(got) != 100 {
				t.Fatalf("claimed %d", len(got))
			}
			var b []NewTask
			for i := range 50 {
				b = append(b, tenantTask("tenant-b", fmt.Sprintf("b-%d", i)))
			}
			if _, err := s.SubmitMany(ctx, b); err != nil {
				t.Fatal(err)
			}
			got := claimNow(t, s, []string{"image"}, 50)
			n := map[string]int{}
			for _, task := range got {
				n[task.Tenant]++
			}
			t.Logf("next 50 claims after tenant-b's 50 arrive: %v", n)
			if n["tenant-a"] < 20 {
				t.Fatalf("tenant-a, with 100 waiting, got %d of the next 50 starts (%v); want about half: tenants in turn", n["tenant-a"], n)
			}
		})
	}
}
