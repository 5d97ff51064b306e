package pgstore

import (
	"context"
	"testing"
)

// TestSubmitExistingKeyIsOneStatement holds the figure docs/performance.md
// gives for BenchmarkSubmitExistingKey: a Submit of a key already held is
// one statement, one round trip, and writes nothing.
func TestSubmitExistingKeyIsOneStatement(t *testing.T) {
	t.Parallel()
	s, counter := countingStore(t)
	ctx := context.Background()
	mustSubmit(t, s, newTask("held"))
	const n = 10
	before := counter.Load()
	for range n {
		got, err := s.Submit(ctx, newTask("held"))
		if err != nil {
			t.Fatal(err)
		}
		if !got.Duplicate {
			t.Fatal("a Submit of a held key was not a duplicate")
		}
	}
	if per := float64(counter.Load()-before) / n; per != 1 {
		t.Errorf("a Submit of a held key made %.2f round trips, want 1 (docs/performance.md)", per)
	}
}
