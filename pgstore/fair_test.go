package pgstore

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// tenantTask is a task of tenant with key key.
func tenantTask(tenant, key string) NewTask {
	nt := newTask(key)
	nt.Tenant = tenant
	return nt
}

// Within a kind and a priority, claims take tenants in turn: a lone task
// of another tenant, submitted behind a tenant's backlog, is claimed
// among the next claims, not after the backlog; priority stays strict.
func TestClaimTakesTenantsInTurn(t *testing.T) {
	t.Parallel()
	for _, shape := range claimShapes {
		t.Run(shape.name, func(t *testing.T) {
			t.Parallel()
			s, _ := setup(t)
			ctx := context.Background()
			backlog := make([]NewTask, 300)
			for i := range backlog {
				backlog[i] = tenantTask("acme", fmt.Sprintf("a-%d", i))
				backlog[i].Kind = shape.kind
			}
			if _, err := s.SubmitMany(ctx, backlog); err != nil {
				t.Fatal(err)
			}
			for i := range 5 { // Submit's own turns, after SubmitMany's
				nt := tenantTask("acme", fmt.Sprintf("a-late-%d", i))
				nt.Kind = shape.kind
				mustSubmit(t, s, nt)
			}
			for _, tenant := range []string{"beta", "gamma"} {
				nt := tenantTask(tenant, tenant+"-1")
				nt.Kind = shape.kind
				mustSubmit(t, s, nt)
			}
			urgent := tenantTask("acme", "a-urgent")
			urgent.Kind, urgent.Priority = shape.kind, 1
			mustSubmit(t, s, urgent)

			var order []string
			for range 6 {
				for _, task := range claimNow(t, s, shape.kinds, 1) {
					order = append(order, task.IdempotencyKey)
				}
			}
			if len(order) != 6 || order[0] != "a-urgent" {
				t.Fatalf("claimed %v; want the higher priority first", order)
			}
			for _, key := range []string{"beta-1", "gamma-1"} {
				if i := slices.Index(order, key); i < 0 || i > 3 {
					t.Fatalf("claimed %v; want %s among the first claims of priority 0 (one per tenant in turn)", order, key)
				}
			}
		})
	}
}

// Two tenants' backlogs, submitted one after the other, are claimed
// alternately.
func TestClaimAlternatesBacklogs(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	for _, tenant := range []string{"acme", "beta"} {
		batch := make([]NewTask, 50)
		for i := range batch {
			batch[i] = tenantTask(tenant, fmt.Sprintf("%s-%d", tenant, i))
		}
		if _, err := s.SubmitMany(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	got := claimNow(t, s, nil, 20)
	count := map[string]int{}
	for _, task := range got {
		count[task.Tenant]++
	}
	if count["acme"] != 10 || count["beta"] != 10 {
		t.Fatalf("20 claims took %v; want 10 of each tenant", count)
	}
}

// A task not yet due (RunAfter in the future, a retry's long backoff)
// keeps a turn the line may have passed long ago. Counted as the line's
// next turn, it pinned the line there: a newcomer's backlog took turns 0,
// 1, 2, … and ran entirely before the established tenants' next turns,
// instead of taking turns with them.
func TestFutureTaskDoesNotPinTheLine(t *testing.T) {
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

// A tenant's backlog scheduled for tomorrow costs nothing to the others
// and pushes no due task back: beside 20,000 scheduled tasks, a claim
// that finds nothing due and another tenant's Submit read as much as on
// an empty queue; the scheduling tenant's own due task, submitted after
// its scheduled backlog, takes the line's next turn (it went behind its
// 20,000 scheduled turns); and scheduled tasks that come due are given
// turns and claimed. Claims and Submit's next-turn lookup read past every
// scheduled task whose turn the line had reached.
func TestScheduledBacklogCostsOthersNothing(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	x := tenantTask("x", "x-first")
	claimEmpty, submitEmpty := claimPlan(t, s, []string{"image"}, 16), submitPlan(t, s, x)
	tomorrow := time.Now().Add(24 * time.Hour)
	for from := 0; from < 20_000; from += 2000 {
		batch := make([]NewTask, 2000)
		for i := range batch {
			batch[i] = tenantTask("planner", fmt.Sprintf("later-%d", from+i))
			batch[i].RunAfter = tomorrow
		}
		if _, err := s.SubmitMany(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.pool.Exec(ctx, "ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
	claimLater, submitLater := claimPlan(t, s, []string{"image"}, 16), submitPlan(t, s, x)
	t.Logf("claim %+v and Submit %+v on an empty queue; %+v and %+v beside 20k scheduled tasks",
		claimEmpty, submitEmpty, claimLater, submitLater)
	if claimLater.Rows != 0 || claimLater.Buffers > claimEmpty.Buffers*3/2+20 {
		t.Errorf("a claim beside 20k scheduled tasks: %+v; on an empty queue %+v", claimLater, claimEmpty)
	}
	if submitLater.Buffers > submitEmpty.Buffers*3/2+10 {
		t.Errorf("Submit beside 20k scheduled tasks: %+v; on an empty queue %+v", submitLater, submitEmpty)
	}
	for i := range 20 {
		mustSubmit(t, s, tenantTask("x", fmt.Sprintf("x-%d", i)))
	}
	own := mustSubmit(t, s, tenantTask("planner", "planner-now"))
	if got := claimNow(t, s, []string{"image"}, 2); !slices.ContainsFunc(got, func(c Task) bool { return c.ID == own.ID }) {
		t.Fatalf("first claim of 2 took %v; want the scheduling tenant's due task among them (x's 20 tasks wait too)",
			keysOf(got))
	}
	if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET run_after = now() - interval '1 minute'
		WHERE idempotency_key IN ('later-0', 'later-1', 'later-2')`); err != nil {
		t.Fatal(err)
	}
	var claimed []string
	for range 4 {
		for _, c := range claimNow(t, s, []string{"image"}, 16) {
			claimed = append(claimed, c.IdempotencyKey)
		}
	}
	for _, key := range []string{"later-0", "later-1", "later-2"} {
		if !slices.Contains(claimed, key) {
			t.Fatalf("claims took %v; want the scheduled tasks that came due (%s)", claimed, key)
		}
	}
}

// A worker of several kinds takes the kinds in turn within a priority:
// a tenant's fresh backlog of a new kind (turns from 0) does not go ahead
// of another tenant's next task of an older kind (turn 5,000), with or
// without limits, and whether the worker names its kinds as literals, has
// a kind that cannot be one, or serves every kind (no Kinds). By raw turn
// it did: the first claims took the new kind's backlog only (a worker of
// every kind did so until schema v10, reading one index of all kinds).
func TestKindsTakeTurnsForAWorkerOfSeveralKinds(t *testing.T) {
	t.Parallel()
	shapes := []struct {
		name    string
		kinds   []string
		newKind string
	}{
		{"any kind", nil, "image"},
		{"literal kinds", []string{"audio", "image"}, "image"},
		{"non-literal kind", []string{"audio", "an image's kind"}, "an image's kind"},
	}
	for _, shape := range shapes {
		for _, limited := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/limited=%v", shape.name, limited), func(t *testing.T) {
				t.Parallel()
				s, _ := setup(t)
				ctx := context.Background()
				if limited {
					if err := s.SetKindLimits(ctx, "audio", KindLimits{MaxRunning: 1000}); err != nil {
						t.Fatal(err)
					}
				}
				old := tenantTask("a", "old-kind")
				old.Kind = "audio"
				oldTask := mustSubmit(t, s, old)
				if _, err := s.pool.Exec(ctx, `UPDATE idemgate_tasks SET turn = 5000 WHERE id = $1::uuid`, oldTask.ID); err != nil {
					t.Fatal(err)
				}
				batch := make([]NewTask, 100)
				for i := range batch {
					batch[i] = tenantTask("b", fmt.Sprintf("new-%d", i))
					batch[i].Kind = shape.newKind
				}
				if _, err := s.SubmitMany(ctx, batch); err != nil {
					t.Fatal(err)
				}
				got := claimNow(t, s, shape.kinds, 2)
				if !slices.ContainsFunc(got, func(c Task) bool { return c.ID == oldTask.ID }) {
					t.Fatalf("a claim of 2 took %v; want the older kind's task beside the new kind's first", keysOf(got))
				}
			})
		}
	}
}
