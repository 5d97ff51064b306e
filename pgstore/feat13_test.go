package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// claimNow runs the claim of a worker for kinds once, for up to n tasks,
// and commits it: the claimed tasks stay running (no handler runs them).
func claimNow(t testing.TB, s *Store, kinds []string, n int) []Task {
	t.Helper()
	w := newWorker(t, s, WorkerConfig{Kinds: kinds, Handler: func(context.Context, Task) Outcome { return Outcome{} }})
	sql, args := w.claimStatement(n)
	rows, _ := s.pool.Query(context.Background(), sql, args)
	got, err := pgx.CollectRows(rows, pgx.RowToStructByName[Task])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// claimShapes are the three claim statements a worker may run: any kind,
// kinds named as literals, and kinds that cannot be literals.
var claimShapes = []struct {
	name  string
	kinds []string
	kind  string // the kind the test's tasks have
}{
	{name: "any kind", kinds: nil, kind: "image"},
	{name: "literal kinds", kinds: []string{"audio", "image"}, kind: "image"},
	{name: "non-literal kind", kinds: []string{"an image's kind"}, kind: "an image's kind"},
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

func TestPollAfterAt(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name  string
		given Task
		want  time.Duration
	}{
		{"pending, runs now", Task{State: StatePending, RunAfter: now.Add(-time.Minute)}, pollPending},
		{"pending, scheduled in 10 minutes", Task{State: StatePending, RunAfter: now.Add(10 * time.Minute)}, 10 * time.Minute},
		{"pending, scheduled within the poll interval", Task{State: StatePending, RunAfter: now.Add(time.Millisecond)}, pollPending},
		{"retrying, backoff of a minute", Task{State: StateRetrying, RunAfter: now.Add(time.Minute)}, time.Minute},
		{"running: run_after is not a schedule", Task{State: StateRunning, RunAfter: now.Add(time.Hour)}, pollRunning},
		{"uncertain: run_after is the reconcile's", Task{State: StateUncertain, RunAfter: now.Add(time.Hour)}, pollUncertain},
		{"succeeded: no polling", Task{State: StateSucceeded, Results: []json.RawMessage{json.RawMessage(`1`)}, RunAfter: now.Add(time.Hour)}, 0},
		{"cancelled: no polling", Task{State: StateCancelled, RunAfter: now.Add(time.Hour)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Project(tt.given).PollAfterAt(now); got != tt.want {
				t.Fatalf("PollAfterAt = %v, want %v", got, tt.want)
			}
		})
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

// A claim for high-priority work reads about as much with a large
// backlog of lower priority of the same kind as without it.
func TestClaimIgnoresLowPriorityBacklog(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	hi := newTask("urgent")
	hi.Priority = 10
	mustSubmit(t, s, hi)
	before := map[string]int{}
	for _, shape := range claimShapes[:2] {
		before[shape.name] = claimBuffers(t, s, shape.kinds)
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, run_after, priority)
		SELECT 'acme', 'o', 'image', 'gpu', 'main', 'low-' || g, 'f', now() - interval '1 hour', g % 5
		FROM generate_series(1, 50000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, "ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
	for _, shape := range claimShapes[:2] {
		after := claimBuffers(t, s, shape.kinds)
		t.Logf("claim (%s) buffers: %d alone, %d with 50k older tasks of lower priority", shape.name, before[shape.name], after)
		if after > 2*before[shape.name]+8 {
			t.Fatalf("the claim (%s) read %d buffers with a lower-priority backlog, %d without", shape.name, after, before[shape.name])
		}
	}
	if got := claimNow(t, s, []string{"image"}, 1); len(got) != 1 || got[0].IdempotencyKey != "urgent" {
		t.Fatalf("claimed %v, want the urgent task", keysOf(got))
	}
}

func keysOf(ts []Task) []string {
	keys := make([]string, len(ts))
	for i, t := range ts {
		keys[i] = t.IdempotencyKey
	}
	return keys
}

// countingStore is a migrated Store whose pool counts the statements it
// sends.
func countingStore(t testing.TB) (*Store, *queryCounter) {
	t.Helper()
	db := newTestDB(t)
	db.store(t) // migrate
	cfg, err := pgxpool.ParseConfig(db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	counter := &queryCounter{}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := New(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	return s, counter
}

func TestSubmitMany(t *testing.T) {
	t.Parallel()
	s, counter := countingStore(t)
	ctx := context.Background()
	held := mustSubmit(t, s, newTask("held"))
	conflicting := newTask("held")
	conflicting.Fingerprint = "another"
	withKind := newTask("held")
	withKind.Kind = "video"
	twiceOther := newTask("twice")
	twiceOther.Fingerprint = "another"
	scheduled := newTask("scheduled")
	scheduled.Params = nil
	scheduled.RunAfter, scheduled.Priority = time.Now().Add(time.Hour).Truncate(time.Microsecond), 7
	withParams := newTask("params")
	withParams.Params = json.RawMessage(`{"b": 1, "a": [true, null]}`)
	empty := newTask("empty")
	empty.Fingerprint = ""
	badJSON := newTask("bad-json")
	badJSON.Params = json.RawMessage(`{"a":`)
	nulJSON := newTask("nul-json")
	nulJSON.Params = json.RawMessage(`"a\u0000b"`)
	nulKey := newTask("nul\x00key")
	tooHigh := newTask("too-high")
	tooHigh.Priority = MaxPriority + 1

	type want struct {
		key       string
		err       error // ErrConflict, or errAny for a refusal
		duplicate bool
		sameAs    int // index of the item whose task this is, or -1
	}
	errAny := errors.New("any error")
	cases := []struct {
		given NewTask
		want  want
	}{
		{newTask("new"), want{key: "new", sameAs: -1}},
		{newTask("held"), want{key: "held", duplicate: true, sameAs: -1}},
		{conflicting, want{err: ErrConflict}},
		{withKind, want{err: ErrConflict}},
		{newTask("twice"), want{key: "twice", sameAs: -1}},
		{newTask("twice"), want{key: "twice", duplicate: true, sameAs: 4}},
		{twiceOther, want{err: ErrConflict}},
		{scheduled, want{key: "scheduled", sameAs: -1}},
		{withParams, want{key: "params", sameAs: -1}},
		{empty, want{err: errAny}},
		{badJSON, want{err: errAny}},
		{nulJSON, want{err: errAny}},
		{nulKey, want{err: errAny}},
		{tooHigh, want{err: errAny}},
		{newTask("new"), want{key: "new", duplicate: true, sameAs: 0}},
	}
	batch := make([]NewTask, len(cases))
	for i, c := range cases {
		batch[i] = c.given
	}
	before := counter.n.Load()
	results, err := s.SubmitMany(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if n := counter.n.Load() - before; n != 1 {
		t.Fatalf("SubmitMany sent %d statements, want 1", n)
	}
	if len(results) != len(batch) {
		t.Fatalf("%d results for %d tasks", len(results), len(batch))
	}
	for i, c := range cases {
		r := results[i]
		switch {
		case c.want.err == ErrConflict:
			if !errors.Is(r.Err, ErrConflict) || r.Task.ID != "" {
				t.Errorf("item %d: got %+v, want ErrConflict and no task", i, r)
			}
			continue
		case c.want.err != nil:
			if r.Err == nil || errors.Is(r.Err, ErrConflict) {
				t.Errorf("item %d: got error %v, want a refusal", i, r.Err)
			}
			continue
		case r.Err != nil:
			t.Errorf("item %d: %v", i, r.Err)
			continue
		}
		if r.Task.IdempotencyKey != c.want.key || r.Task.Duplicate != c.want.duplicate {
			t.Errorf("item %d: key %q duplicate %v, want %q %v", i, r.Task.IdempotencyKey, r.Task.Duplicate, c.want.key, c.want.duplicate)
		}
		if c.want.sameAs >= 0 && r.Task.ID != results[c.want.sameAs].Task.ID {
			t.Errorf("item %d: task %s, want item %d's %s", i, r.Task.ID, c.want.sameAs, results[c.want.sameAs].Task.ID)
		}
	}
	if results[1].Task.ID != held.ID {
		t.Errorf("the held key read back task %s, want %s", results[1].Task.ID, held.ID)
	}
	if got := results[7].Task; !got.RunAfter.Equal(scheduled.RunAfter) || got.Priority != 7 {
		t.Errorf("scheduled task stored with run_after %v priority %d, want %v 7", got.RunAfter, got.Priority, scheduled.RunAfter)
	}
	if got := string(results[8].Task.Params); got != `{"a": [true, null], "b": 1}` {
		t.Errorf("params read back as %s", got)
	}
	if got := results[0].Task.Params; string(got) != `{"prompt": "a cat"}` {
		t.Errorf("newTask's params read back as %s", got)
	}
	if got := results[7].Task.Params; got != nil {
		t.Errorf("nil params read back as %s", got)
	}
	// held, new, twice, scheduled, params.
	if n := countRows(t, s.pool, "true"); n != 5 {
		t.Fatalf("%d rows, want 5", n)
	}
	// The same batch again: every stored task comes back as a duplicate.
	again, err := s.SubmitMany(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	for i := range again {
		if (again[i].Err == nil) != (results[i].Err == nil) || again[i].Task.ID != results[i].Task.ID ||
			(again[i].Err == nil && !again[i].Task.Duplicate) {
			t.Errorf("item %d again: %+v, first %+v", i, again[i], results[i])
		}
	}
	if n := countRows(t, s.pool, "true"); n != 5 {
		t.Fatalf("%d rows after the batch again, want 5", n)
	}
	none, err := s.SubmitMany(ctx, nil)
	if err != nil || len(none) != 0 {
		t.Fatalf("empty batch: %v, %v", none, err)
	}
}

// Many goroutines on two pools submit overlapping batches of the same
// keys in different orders: one task per key, every result of a key has
// its ID, and no batch fails (a deadlock between two batches would).
func TestSubmitManyRace(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	stores := []*Store{db.store(t), db.store(t)}
	const (
		keys       = 60
		goroutines = 24
		perBatch   = 40
		rounds     = 3
	)
	ctx := context.Background()
	var (
		mu  sync.Mutex
		ids = map[string]map[string]bool{} // key → IDs returned
	)
	for round := range rounds {
		// Every round races on keys no round used before, all goroutines
		// released at once.
		start := make(chan struct{})
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(g), uint64(round)))
				batch := make([]NewTask, perBatch)
				for i := range batch {
					batch[i] = newTask(fmt.Sprintf("r%d-k%d", round, rng.IntN(keys)))
				}
				<-start
				res, err := stores[g%2].SubmitMany(ctx, batch)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				for i, r := range res {
					if r.Err != nil {
						t.Errorf("%s: %v", batch[i].IdempotencyKey, r.Err)
						continue
					}
					k := batch[i].IdempotencyKey
					if ids[k] == nil {
						ids[k] = map[string]bool{}
					}
					ids[k][r.Task.ID] = true
				}
			})
		}
		close(start)
		wg.Wait()
	}
	for k, set := range ids {
		if len(set) != 1 {
			t.Errorf("key %s got %d task IDs", k, len(set))
		}
	}
	if n := countRows(t, stores[0].pool, "true"); n != len(ids) {
		t.Fatalf("%d rows for %d keys", n, len(ids))
	}
}

// SubmitMany wakes a listening worker for the new tasks it stored.
func TestSubmitManyWakesWorkers(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	done := make(chan string, 10)
	w := newWorker(t, s, WorkerConfig{PollInterval: time.Hour, Handler: func(_ context.Context, task Task) Outcome {
		done <- task.IdempotencyKey
		return Succeeded(json.RawMessage(`1`))
	}})
	runWorker(t, w)
	waitFor(t, func() bool { return countActivity(t, s.pool, listening) == 1 && w.claims.Load() >= 2 })
	res, err := s.SubmitMany(context.Background(), []NewTask{newTask("a"), newTask("b")})
	if err != nil || res[0].Err != nil || res[1].Err != nil {
		t.Fatal(err, res)
	}
	got := map[string]bool{}
	timeout := time.After(10 * time.Second)
	for len(got) < 2 {
		select {
		case k := <-done:
			got[k] = true
		case <-timeout:
			t.Fatalf("ran %v within 10s with an hour's poll interval: no wake-up", got)
		}
	}
}

// SubmitMany and Submit announce only new tasks that may run now, of the
// kinds the limiter lets through: a notification arrives in commit order,
// so the first one a listener gets says which statements sent none.
func TestNewTasksAreAnnouncedOnlyWhenDue(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		t.Fatal(err)
	}
	withKind := func(key, kind string) NewTask {
		nt := newTask(key)
		nt.Kind = kind
		return nt
	}
	// A batch whose kinds the limiter holds back.
	if _, err := s.submitBatch(ctx, []NewTask{withKind("a", "held-back")}, []int{0}, nil); err != nil {
		t.Fatal(err)
	}
	// Tasks scheduled for later, by SubmitMany and by Submit.
	later := withKind("b", "scheduled")
	later.RunAfter = time.Now().Add(time.Hour)
	later2 := withKind("c", "scheduled")
	later2.RunAfter = later.RunAfter
	if res, err := s.SubmitMany(ctx, []NewTask{later}); err != nil || res[0].Err != nil {
		t.Fatal(err, res)
	}
	mustSubmit(t, s, later2)
	// Then one that is announced.
	if res, err := s.SubmitMany(ctx, []NewTask{withKind("d", "due"), withKind("e", "due")}); err != nil || res[0].Err != nil {
		t.Fatal(err, res)
	}
	n, err := conn.Conn().WaitForNotification(ctx)
	if err != nil {
		t.Fatalf("no notification after SubmitMany: %v", err)
	}
	if n.Payload != "due" {
		t.Fatalf("first notification for kind %q; want \"due\" (nothing for held-back or scheduled tasks)", n.Payload)
	}
	if _, err := conn.Exec(ctx, "UNLISTEN *"); err != nil {
		t.Fatal(err)
	}
}

// Stats reads about as much with a large history of finished tasks as
// without it: it reads the unfinished tasks through their partial
// indexes, never the whole table.
func TestStatsIgnoresFinishedTasks(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	for i, state := range []State{StatePending, StateRunning, StateRetrying, StateUncertain} {
		task := mustSubmit(t, s, newTask(fmt.Sprint("open-", i)))
		if _, err := s.pool.Exec(ctx, "UPDATE idemgate_tasks SET state = $1 WHERE id = $2", state, task.ID); err != nil {
			t.Fatal(err)
		}
	}
	statsBuffers := func() int {
		var plan []map[string]any
		if err := s.pool.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sqlStats).Scan(&plan); err != nil {
			t.Fatal(err)
		}
		top := plan[0]["Plan"].(map[string]any)
		return int(top["Shared Hit Blocks"].(float64) + top["Shared Read Blocks"].(float64))
	}
	if _, err := s.pool.Exec(ctx, "ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
	before := statsBuffers()
	if _, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint, state, finished_at)
		SELECT 'acme', 'o', 'image', 'gpu', 'main', 'done-' || g, 'f',
			(ARRAY['succeeded', 'failed', 'cancelled'])[1 + g % 3], now() - g * interval '1 second'
		FROM generate_series(1, 50000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, "ANALYZE idemgate_tasks"); err != nil {
		t.Fatal(err)
	}
	after := statsBuffers()
	t.Logf("Stats buffers: %d with 4 unfinished tasks, %d with 50k finished ones besides", before, after)
	if after > 2*before+8 {
		t.Fatalf("Stats read %d buffers with 50k finished tasks, %d without", after, before)
	}
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, state := range []State{StatePending, StateRunning, StateRetrying, StateUncertain} {
		if n := st.Counts["image"][state]; n != 1 {
			t.Errorf("Stats counted %d %s tasks, want 1", n, state)
		}
	}
}
