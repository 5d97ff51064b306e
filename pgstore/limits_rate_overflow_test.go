//go:build review

package pgstore

import (
	"context"
	"testing"
)

// A StartsPerSecond that validate accepts (finite, ≥ 0) but whose bucket
// holds more than 2^31 tokens: the claim casts floor(tokens) to int.
// A huge rate means "practically unlimited"; it must never stop claims.
func TestReviewHugeStartsPerSecondDoesNotBreakClaims(t *testing.T) {
	t.Parallel()
	for _, rate := range []float64{3e9, 1e300} {
		s, _ := setup(t)
		ctx := context.Background()
		if err := s.SetKindLimits(ctx, "image", KindLimits{StartsPerSecond: rate}); err != nil {
			t.Logf("SetKindLimits(%v) refused: %v (acceptable)", rate, err)
			continue
		}
		mustSubmit(t, s, newTask("huge-rate"))
		// Another kind claimed by the same any-kind worker suffers too.
		other := newTask("other-kind")
		other.Kind = "audio"
		mustSubmit(t, s, other)
		w := newWorker(t, s, WorkerConfig{Handler: func(context.Context, Task) Outcome { return Outcome{} }})
		sql, args := w.claimStatement(4)
		got, err := w.runClaim(ctx, sql, args)
		if err != nil {
			t.Errorf("rate %v: the claim of every kind fails: %v", rate, err)
			continue
		}
		if len(got) != 2 {
			t.Errorf("rate %v: claimed %d tasks; want 2", rate, len(got))
		}
	}
}
