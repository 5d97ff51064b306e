package pgstore

import (
	"context"
	"testing"

	"github.com/idemgate/idemgate/internal/wait"
)

// SetKindLimits stores its limits when the kind's row is held by another
// transaction (a claim of a rate-limited kind updates the row's tokens
// at every claim; an UpdateKindLimits locks it), whatever
// default_transaction_isolation says: it waits for the holder and
// writes over the holder's change. Under REPEATABLE READ and
// SERIALIZABLE its upsert, a statement of its own, failed with 40001
// ("could not serialize access due to concurrent update") once the
// holder committed.
func TestSetKindLimitsWhileTheKindsRowIsHeldUnderEveryIsolationLevel(t *testing.T) {
	t.Parallel()
	for _, level := range isolationLevels {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			s, db := setup(t)
			ctx := hangBound(t)
			if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunning: 1, StartsPerSecond: 10}); err != nil {
				t.Fatal(err)
			}
			sl := db.storeAt(t, level)
			// A claim's update of the tokens, not committed yet.
			holder, err := s.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Rollback(context.Background()) //nolint:errcheck // committed below
			if _, err := holder.Exec(ctx, `UPDATE idemgate_kind_limits SET tokens = tokens - 1 WHERE kind = 'image'`); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- sl.SetKindLimits(ctx, "image", KindLimits{MaxRunning: 7, StartsPerSecond: 10}) }()
			wait.For(t, patience, "SetKindLimits waits for the row", func() bool {
				var n int
				if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'`).Scan(&n); err != nil {
					t.Error(err)
					return true
				}
				return n > 0
			})
			if err := holder.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("SetKindLimits after the holder committed: %v", err)
			}
			got, err := s.KindLimits(ctx, "image")
			if err != nil {
				t.Fatal(err)
			}
			if got.MaxRunning != 7 {
				t.Fatalf("limits %+v; want MaxRunning 7", got)
			}
		})
	}
}
