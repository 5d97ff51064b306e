//go:build review

package pgstore

import (
	"context"
	"testing"
)

// At a 100k-task backlog of kind image, the claims stay index reads:
// a claim of image (fair order) and, with image paused (or at its
// MaxRunning), the claim of another kind by a worker of every kind
// (WorkerConfig.Kinds empty, as a catch-all worker runs) must not read
// past the paused kind's backlog on every claim.
func TestReviewClaimPlanWithPausedBacklog(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	other := newTask("lone-audio")
	other.Kind = "audio"
	mustSubmit(t, s, other)
	before := map[string]int{}
	shapes := map[string][]string{"any kind": nil, "literal audio": {"audio"}, "literal image": {"image"}}
	for name, kinds := range shapes {
		before[name] = claimBuffers(t, s, kinds)
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after, turn)
		SELECT 'tenant-' || (g % 100), 'o', 'image', 'gpu', 'main', 'bk-' || g, 'f', now() - interval '1 hour', g / 100
		FROM generate_series(1, 100000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, "ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
	img := claimBuffers(t, s, []string{"image"})
	t.Logf("claim of image at a 100k backlog (fair order): %d buffers (%d on an empty queue)", img, before["literal image"])
	if img > 200 {
		t.Errorf("the fair claim read %d buffers at a 100k backlog", img)
	}
	// Then the held-back backlog sorts ahead of the audio task: a higher
	// priority (the order of the any-kind index is priority first).
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET priority = 1 WHERE kind = 'image'`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, "VACUUM ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
	for _, l := range []KindLimits{{Paused: true}, {MaxRunning: 1}} {
		if err := s.SetKindLimits(ctx, "image", l); err != nil {
			t.Fatal(err)
		}
		if l.MaxRunning > 0 {
			claimNow(t, s, []string{"image"}, 1) // image at its limit
		}
		for _, name := range []string{"any kind", "literal audio"} {
			after := claimBuffers(t, s, shapes[name])
			t.Logf("%+v: claim (%s) of the lone audio task: %d buffers; %d on an empty queue", l, name, after, before[name])
			if after > 2*before[name]+50 {
				t.Errorf("%+v: the claim (%s) read %d buffers past image's held-back 100k backlog (%d without)",
					l, name, after, before[name])
			}
		}
	}
}
