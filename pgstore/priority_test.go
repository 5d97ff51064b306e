package pgstore

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// a steady stream of higher-priority tasks. Priority is strict
// (no aging): a lower-priority task waits for as long as a higher one is
// runnable in its kind. This test pins that documented behaviour; ties
// within a priority go oldest first.
func TestPriorityIsStrict(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	low := newTask("low")
	low.Priority = MinPriority
	mustSubmit(t, s, low)
	tieA, tieB := newTask("tie-a"), newTask("tie-b")
	tieA.Priority, tieB.Priority = 1, 1
	mustSubmit(t, s, tieA)
	mustSubmit(t, s, tieB)
	want := []string{"tie-a", "tie-b"}
	for i := range 20 {
		high := newTask(fmt.Sprint("high-", i))
		high.Priority = MaxPriority
		mustSubmit(t, s, high)
		if got := keysOf(claimNow(t, s, []string{"image"}, 1)); len(got) != 1 || got[0] != high.IdempotencyKey {
			t.Fatalf("round %d: claimed %v, want %s", i, got, high.IdempotencyKey)
		}
	}
	var got []string
	for range 3 {
		got = append(got, keysOf(claimNow(t, s, []string{"image"}, 1))...)
	}
	if want = append(want, "low"); !slices.Equal(got, want) {
		t.Errorf("after the stream: claimed %v, want %v", got, want)
	}
}

func TestPriorityIsClaimedHighestFirst(t *testing.T) {
	t.Parallel()
	for _, shape := range claimShapes {
		t.Run(shape.name, func(t *testing.T) {
			t.Parallel()
			s, _ := setup(t)
			// Submitted in this order; the claim order is by priority,
			// then by age (run_after) within a priority.
			given := []struct {
				key      string
				priority int
			}{{"zero", 0}, {"five-old", 5}, {"minus", -3}, {"five-new", 5}, {"ten", 10}, {"max", MaxPriority}, {"min", MinPriority}}
			base := time.Now().Add(-time.Hour)
			for i, g := range given {
				nt := newTask(g.key)
				nt.Kind, nt.Priority, nt.RunAfter = shape.kind, g.priority, base.Add(time.Duration(i)*time.Second)
				if got := mustSubmit(t, s, nt); got.Priority != g.priority {
					t.Fatalf("%s: priority read back as %d, want %d", g.key, got.Priority, g.priority)
				}
			}
			// Another kind at a higher priority does not jump the line of
			// a worker for this kind only.
			other := newTask("other-kind")
			other.Kind, other.Priority = "video", MaxPriority
			mustSubmit(t, s, other)
			want := []string{"max", "ten", "five-old", "five-new", "zero", "minus", "min"}
			if shape.kinds == nil {
				want = slices.Insert(want, 1, "other-kind") // same priority as "max", younger
			}
			var order []string
			for range len(want) + 1 {
				order = append(order, keysOf(claimNow(t, s, shape.kinds, 1))...)
			}
			if !slices.Equal(order, want) {
				t.Fatalf("claim order %v, want %v", order, want)
			}
		})
	}
}

func TestPriorityOutOfRangeIsRefused(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	for _, p := range []int{MaxPriority + 1, MinPriority - 1} {
		nt := newTask(fmt.Sprint("p", p))
		nt.Priority = p
		if _, err := s.Submit(context.Background(), nt); err == nil {
			t.Fatalf("priority %d accepted", p)
		}
	}
	if n := countRows(t, s.pool, "true"); n != 0 {
		t.Fatalf("%d rows stored", n)
	}
}
