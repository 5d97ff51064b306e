package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// Attack: RunAfter far outside what Postgres's timestamptz holds (and
// what 64-bit microseconds since 2000 hold). One such task must not sink
// the batch it is in, nor be stored as some other time.
func TestAttackRunAfterOutOfRange(t *testing.T) {
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

// Attack: RunAfter in another zone and with a monotonic reading; zero
// means now; the past means now.
func TestAttackRunAfterZonesAndClock(t *testing.T) {
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

// Attack: the same key twice in one batch with different owners and
// kinds; the first stores the task, the others conflict; a repeat of the
// batch gives the same answers.
func TestAttackSubmitManyDuplicatesInBatch(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	a := newTask("k")
	b := newTask("k")
	b.Owner = "owner-b"
	c := newTask("k")
	c.Kind = "audio"
	d := newTask("k") // same as a
	for round := range 2 {
		res, err := s.SubmitMany(ctx, []NewTask{a, b, c, d})
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Err != nil || res[0].Task.Duplicate != (round == 1) {
			t.Errorf("round %d: first: %+v, want stored (duplicate only on the repeat)", round, res[0])
		}
		if !errors.Is(res[1].Err, ErrConflict) || !errors.Is(res[2].Err, ErrConflict) {
			t.Errorf("round %d: other owner %v, other kind %v; want ErrConflict", round, res[1].Err, res[2].Err)
		}
		if res[3].Err != nil || !res[3].Task.Duplicate || res[3].Task.ID != res[0].Task.ID {
			t.Errorf("round %d: same task again: %+v, want the first's task as duplicate", round, res[3])
		}
	}
}

// Attack: NUL and invalid UTF-8 anywhere: the task gets its own error in a
// batch; Submit refuses it with an error, not a stored mangled key.
func TestAttackSubmitManyNUL(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	var batch []NewTask
	for i, mut := range []func(*NewTask){
		func(t *NewTask) { t.IdempotencyKey += "\x00" },
		func(t *NewTask) { t.Owner += "\xff" },
		func(t *NewTask) { t.Params = []byte(`{"p":"\u0000"}`) },
		func(t *NewTask) { t.Trace = "tp\x00\xff" }, // made storable, not refused
		func(t *NewTask) {},
	} {
		nt := newTask(fmt.Sprint("nul-", i))
		mut(&nt)
		batch = append(batch, nt)
	}
	res, err := s.SubmitMany(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if res[i].Err == nil {
			t.Errorf("item %d stored: %+v", i, res[i].Task)
		}
	}
	if res[3].Err != nil || res[4].Err != nil {
		t.Errorf("storable items: %v, %v", res[3].Err, res[4].Err)
	}
	for i := range 2 {
		if _, err := s.Submit(ctx, batch[i]); err == nil {
			t.Errorf("Submit of item %d: stored", i)
		}
	}
}

// Attack: an empty batch, a nil batch, and a large one (one statement).
func TestAttackSubmitManySizes(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	for _, b := range [][]NewTask{nil, {}} {
		res, err := s.SubmitMany(ctx, b)
		if err != nil || len(res) != 0 {
			t.Errorf("empty batch: %v %v", res, err)
		}
	}
	big := make([]NewTask, 20000)
	for i := range big {
		big[i] = newTask(fmt.Sprint("big-", i%15000)) // 5000 in-batch repeats
	}
	res, err := s.SubmitMany(ctx, big)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("item %d: %v", i, r.Err)
		}
		k := big[i].IdempotencyKey
		if id, ok := ids[k]; ok {
			if id != r.Task.ID || !r.Task.Duplicate {
				t.Fatalf("item %d: key %s as %s dup %v, first was %s", i, k, r.Task.ID, r.Task.Duplicate, id)
			}
		} else {
			ids[k] = r.Task.ID
		}
	}
	if len(ids) != 15000 {
		t.Errorf("%d distinct tasks, want 15000", len(ids))
	}
}

// Attack: a canceled context mid-batch: an error, no results, and a
// repeat stores each task once.
func TestAttackSubmitManyCanceled(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	batch := make([]NewTask, 5000)
	for i := range batch {
		batch[i] = newTask(fmt.Sprint("c-", i))
	}
	for _, d := range []time.Duration{0, time.Millisecond, 5 * time.Millisecond} {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		res, err := s.SubmitMany(ctx, batch)
		cancel()
		if err == nil && len(res) != len(batch) {
			t.Fatalf("no error and %d results", len(res))
		}
		if err != nil && res != nil {
			t.Fatalf("error %v with results", err)
		}
	}
	res, err := s.SubmitMany(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i, r := range res {
		if r.Err != nil || seen[r.Task.ID] {
			t.Fatalf("item %d: %+v", i, r)
		}
		seen[r.Task.ID] = true
	}
}

// Attack: SubmitMany batches overlapping in keys (in different orders)
// race with single Submits of the same keys, some with another owner:
// each key is one task; every answer is that task or ErrConflict for the
// other owner; no deadlock error.
func TestAttackSubmitManyRacesSubmit(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	const keys, batchers, singles = 200, 6, 6
	var (
		mu    sync.Mutex
		ids   = map[string]string{}
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	record := func(t *testing.T, nt NewTask, task Task, err error) {
		if nt.Owner != "owner-a" {
			if err != nil && !errors.Is(err, ErrConflict) {
				t.Errorf("other owner %s: %v", nt.IdempotencyKey, err)
			}
			if err == nil {
				mu.Lock()
				defer mu.Unlock()
				if id, ok := ids[nt.IdempotencyKey]; ok && id != task.ID {
					t.Errorf("key %s: two tasks %s %s", nt.IdempotencyKey, id, task.ID)
				}
				ids[nt.IdempotencyKey] = task.ID
			}
			return
		}
		if errors.Is(err, ErrConflict) {
			return // the other owner got there first
		}
		if err != nil {
			t.Errorf("key %s: %v", nt.IdempotencyKey, err)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if id, ok := ids[nt.IdempotencyKey]; ok && id != task.ID {
			t.Errorf("key %s: two tasks %s %s", nt.IdempotencyKey, id, task.ID)
		}
		ids[nt.IdempotencyKey] = task.ID
	}
	task := func(i, who int) NewTask {
		nt := newTask(fmt.Sprint("r-", i))
		if who%3 == 2 {
			nt.Owner = "owner-b"
		}
		return nt
	}
	for b := range batchers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			batch := make([]NewTask, keys)
			for i := range keys {
				k := i
				if b%2 == 1 {
					k = keys - 1 - i // opposite order
				}
				batch[i] = task(k, b)
			}
			res, err := s.SubmitMany(ctx, batch)
			if err != nil {
				t.Errorf("batch %d: %v", b, err)
				return
			}
			for i, r := range res {
				record(t, batch[i], r.Task, r.Err)
			}
		}()
	}
	for w := range singles {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := range keys {
				nt := task((i*7+w)%keys, w)
				got, err := s.Submit(ctx, nt)
				record(t, nt, got, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(ids) != keys {
		t.Errorf("%d keys with a task, want %d", len(ids), keys)
	}
}

// Attack: a RunAfter long past (a caller's "run now" as some old time).
// Stats' age of the oldest runnable task counts from when the task could
// first run here, not from the given time: a time more than 292 years ago
// overflowed time.Duration, and any past time made a fresh task look old
// and let it jump the line of its priority.
func TestAttackRunAfterLongPast(t *testing.T) {
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

// Attack: Stats while tasks are submitted (single and batched), claimed
// and finished by a running worker, from many goroutines: no error, no
// negative count or age, never more unfinished tasks than were submitted,
// and nothing left at the end.
func TestAttackStatsUnderChurn(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := newWorker(t, s, WorkerConfig{Kinds: []string{"image", "audio"}, Concurrency: 8,
		Handler: func(context.Context, Task) Outcome { return Succeeded(json.RawMessage(`1`)) }})
	runDone := make(chan error, 1)
	go func() { runDone <- w.Run(ctx) }()
	defer func() { cancel(); <-runDone }()
	const submitters, per = 6, 100
	var wg sync.WaitGroup
	for g := range submitters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				nt := newTask(fmt.Sprint("churn-", g, "-", i))
				if i%2 == 1 {
					nt.Kind = "audio"
				}
				nt.Priority = i % 5
				if g%2 == 0 {
					if _, err := s.Submit(ctx, nt); err != nil {
						t.Error(err)
						return
					}
				} else if res, err := s.SubmitMany(ctx, []NewTask{nt}); err != nil || res[0].Err != nil {
					t.Error(err, res)
					return
				}
			}
		}()
	}
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for range 4 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				st, err := s.Stats(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				total := 0
				for kind, m := range st.Counts {
					for state, n := range m {
						if n <= 0 {
							t.Errorf("Stats: %s %s = %d", kind, state, n)
						}
						total += n
					}
				}
				if total > submitters*per || st.OldestRunnable < 0 || st.OldestUncertain != 0 {
					t.Errorf("Stats: %+v", st)
				}
			}
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := s.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Counts) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tasks left unfinished: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	readers.Wait()
}

// Attack: a steady stream of higher-priority tasks. Priority is strict
// (no aging): a lower-priority task waits for as long as a higher one is
// runnable in its kind. This test pins that documented behaviour; ties
// within a priority go oldest first.
func TestAttackPriorityStarvation(t *testing.T) {
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
