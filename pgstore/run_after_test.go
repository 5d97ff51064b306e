package pgstore

import (
	"context"
	"testing"
	"time"
)

// RunAfter far outside what Postgres's timestamptz holds (and
// what 64-bit microseconds since 2000 hold). One such task must not sink
// the batch it is in, nor be stored as some other time.
func TestRunAfterOutsidePostgresRange(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	for _, at := range []time.Time{
		time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC), // past int64 µs since 2000
		time.Date(294300, 1, 1, 0, 0, 0, 0, time.UTC), // past Postgres's end (294276 AD)
	} {
		bad := newTask("far-" + at.Format("2006"))
		bad.RunAfter = at
		good := newTask("good-" + at.Format("2006"))
		res, err := s.SubmitMany(ctx, []NewTask{bad, good})
		if err != nil {
			t.Errorf("RunAfter %v: the batch failed: %v", at, err)
			continue
		}
		if res[0].Err == nil {
			t.Errorf("RunAfter %v: stored, RunAfter read back as %v; want the task refused", at, res[0].Task.RunAfter)
		}
		if res[1].Err != nil {
			t.Errorf("RunAfter %v: the good task of the batch got %v", at, res[1].Err)
		}
		if got, err := s.Submit(ctx, bad); err == nil {
			t.Errorf("Submit RunAfter %v: stored, read back as %v; want an error", at, got.RunAfter)
		}
	}
	// Before Postgres's first time (4713 BC): due now, in a batch or not.
	early := newTask("early")
	early.RunAfter = time.Date(-5000, 1, 1, 0, 0, 0, 0, time.UTC)
	res, err := s.SubmitMany(ctx, []NewTask{early, newTask("early-good")})
	if err != nil || res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("RunAfter 5001 BC: batch %v, items %v", err, res)
	}
	if res[0].Task.RunAfter.After(time.Now().Add(time.Minute)) {
		t.Errorf("RunAfter 5001 BC read back as %v, want now", res[0].Task.RunAfter)
	}
	early.IdempotencyKey = "early-single"
	if _, err := s.Submit(ctx, early); err != nil {
		t.Errorf("Submit RunAfter 5001 BC: %v", err)
	}
}

// RunAfter in another zone and with a monotonic reading; zero
// means now; the past means now.
func TestRunAfterInAnyZone(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	tokyo := time.FixedZone("JST", 9*3600)
	at := time.Now().Add(time.Hour) // has a monotonic reading
	nt := newTask("zoned")
	nt.RunAfter = at.In(tokyo)
	got := mustSubmit(t, s, nt)
	if d := got.RunAfter.Sub(at); d < -time.Microsecond || d > time.Microsecond {
		t.Errorf("RunAfter in JST read back %v, want %v", got.RunAfter, at)
	}
	past := newTask("past")
	past.RunAfter = time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC) // not zero: year 1
	res, err := s.SubmitMany(ctx, []NewTask{past})
	if err != nil || res[0].Err != nil {
		t.Fatalf("RunAfter year 1: %v %v", err, res[0].Err)
	}
	if c := claimNow(t, s, []string{"image"}, 10); len(c) != 1 || c[0].IdempotencyKey != "past" {
		t.Errorf("a task due in year 1 is not claimable now: claimed %v", keysOf(c))
	}
}

// a RunAfter long past (a caller's "run now" as some old time).
// Stats' age of the oldest runnable task counts from when the task could
// first run here, not from the given time: a time more than 292 years ago
// overflowed time.Duration, and any past time made a fresh task look old
// and let it jump the line of its priority.
func TestRunAfterLongPastIsNow(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	first := newTask("first")
	mustSubmit(t, s, first)
	old := newTask("old")
	old.RunAfter = time.Date(1700, 1, 1, 0, 0, 0, 0, time.UTC)
	oldBatch := newTask("old-batch")
	oldBatch.RunAfter = time.Date(1800, 1, 1, 0, 0, 0, 0, time.UTC)
	mustSubmit(t, s, old)
	if res, err := s.SubmitMany(ctx, []NewTask{oldBatch}); err != nil || res[0].Err != nil {
		t.Fatalf("SubmitMany: %v %v", err, res)
	}
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.OldestRunnable <= 0 || st.OldestRunnable > time.Hour {
		t.Errorf("Stats.OldestRunnable = %v with 3 tasks waiting since just now, want above zero and under an hour", st.OldestRunnable)
	}
	if got := keysOf(claimNow(t, s, []string{"image"}, 1)); len(got) != 1 || got[0] != "first" {
		t.Errorf("first claim took %v, want the task submitted first (a past RunAfter jumped the line)", got)
	}
}

func TestRunAfterHoldsTheTaskBack(t *testing.T) {
	t.Parallel()
	for _, shape := range claimShapes {
		t.Run(shape.name, func(t *testing.T) {
			t.Parallel()
			s, _ := setup(t)
			ctx := context.Background()
			later := time.Now().Add(time.Hour).Truncate(time.Microsecond)
			scheduled := newTask("scheduled")
			scheduled.Kind, scheduled.RunAfter = shape.kind, later
			past := newTask("past")
			past.Kind, past.RunAfter = shape.kind, time.Now().Add(-time.Minute)
			sub := mustSubmit(t, s, scheduled)
			mustSubmit(t, s, past)
			if !sub.RunAfter.Equal(later) {
				t.Fatalf("RunAfter read back as %v, want %v", sub.RunAfter, later)
			}
			got := claimNow(t, s, shape.kinds, 10)
			if len(got) != 1 || got[0].IdempotencyKey != "past" {
				t.Fatalf("claimed %v, want only the task whose time has come", keysOf(got))
			}
			// Its time comes.
			if _, err := s.pool.Exec(ctx, "UPDATE idemgate_tasks SET run_after = now() - interval '1 second' WHERE id = $1", sub.ID); err != nil {
				t.Fatal(err)
			}
			got = claimNow(t, s, shape.kinds, 10)
			if len(got) != 1 || got[0].ID != sub.ID {
				t.Fatalf("claimed %v once its time came, want the scheduled task", keysOf(got))
			}
		})
	}
}

func TestScheduledTaskIsProjectedWithItsTime(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	later := time.Now().Add(90 * time.Minute)
	nt := newTask("later")
	nt.RunAfter = later
	task := mustSubmit(t, s, nt)
	got, err := s.Get(context.Background(), task.Tenant, task.Owner, task.ID)
	if err != nil {
		t.Fatal(err)
	}
	p := Project(got)
	if !p.RunAfter.Equal(later.Truncate(time.Microsecond)) {
		t.Fatalf("projection's RunAfter %v, want %v", p.RunAfter, later)
	}
	now := p.RunAfter.Add(-time.Hour)
	if wait := p.PollAfterAt(now); wait != time.Hour {
		t.Fatalf("PollAfterAt an hour before the task's time = %v, want 1h", wait)
	}
	runsNow := mustSubmit(t, s, newTask("now"))
	if wait := Project(runsNow).PollAfterAt(runsNow.CreatedAt); wait != pollPending {
		t.Fatalf("a task to run now: PollAfterAt = %v, want %v", wait, pollPending)
	}
}
