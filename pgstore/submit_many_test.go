package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/pgtrace"
	"github.com/idemgate/idemgate/internal/wait"
)

// the same key twice in one batch with different owners and
// kinds; the first stores the task, the others conflict; a repeat of the
// batch gives the same answers.
func TestSubmitManyKeyTwiceInOneBatch(t *testing.T) {
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

// NUL and invalid UTF-8 anywhere: the task gets its own error in a
// batch; Submit refuses it with an error, not a stored mangled key.
func TestSubmitManyRefusesNULPerItem(t *testing.T) {
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

// an empty batch, a nil batch, and a large one (one statement).
func TestSubmitManyBatchSizes(t *testing.T) {
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

// a canceled context mid-batch: an error, no results, and a
// repeat stores each task once.
func TestSubmitManyCancelledContext(t *testing.T) {
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

// SubmitMany batches overlapping in keys (in different orders)
// race with single Submits of the same keys, some with another owner:
// each key is one task; every answer is that task or ErrConflict for the
// other owner; no deadlock error.
func TestSubmitManyRacesSubmit(t *testing.T) {
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

func keysOf(ts []Task) []string {
	keys := make([]string, len(ts))
	for i, t := range ts {
		keys[i] = t.IdempotencyKey
	}
	return keys
}

// countingStore is a migrated Store whose pool counts its round trips (a
// statement each, a batch once).
func countingStore(t testing.TB) (*Store, *pgtrace.RoundTrips) {
	t.Helper()
	counter := &pgtrace.RoundTrips{}
	s := newTestDB(t).storeWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = counter })
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
	before := counter.Load()
	results, err := s.SubmitMany(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if n := counter.Load() - before; n != 1 {
		t.Fatalf("SubmitMany made %d round trips, want 1", n)
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
	wait.For(t, patience, "the worker listens and is idle", func() bool { return countActivity(t, s.pool, listening) == 1 && w.claims.Load() >= 2 })
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

// Keys that differ only in case, Unicode normalization, invisible or
// white-space characters are distinct keys (Go dedupes by bytes, like the
// unique index), each item gets its own key's task back, and a repeat of
// the batch, shuffled, gets the same tasks as duplicates.
func TestSubmitManyNearlyEqualKeysAreDistinct(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	keys := []string{"k", "K", "é", "e\u0301", "ǅ", "ǆ", "Ǆ", "a b", "a  b", "a\tb", "ß", "ss", "\u00a0", " ",
		"İ", "i\u0307", "x\u200bx", "xx", "\U0001F600", "\uFFFD", strings.Repeat("long", 500), strings.Repeat("long", 500) + "!"}
	batch := make([]NewTask, len(keys))
	for i, k := range keys {
		batch[i] = newTask(k)
	}
	ids := map[string]string{}
	for round := range 2 {
		rand.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
		res, err := s.SubmitMany(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			k := batch[i].IdempotencyKey
			switch {
			case r.Err != nil:
				t.Fatalf("round %d, key %q: %v", round, k, r.Err)
			case r.Task.IdempotencyKey != k:
				t.Errorf("round %d, key %q: got the task of key %q", round, k, r.Task.IdempotencyKey)
			case r.Task.Duplicate != (round == 1):
				t.Errorf("round %d, key %q: duplicate %v", round, k, r.Task.Duplicate)
			case round == 1 && ids[k] != r.Task.ID:
				t.Errorf("key %q: task %s on the repeat, %s first", k, r.Task.ID, ids[k])
			}
			ids[k] = r.Task.ID
		}
	}
	if n := countRows(t, s.pool, "true"); n != len(keys) {
		t.Errorf("%d rows for %d keys", n, len(keys))
	}
}

// Batches of many lines (kinds, tenants, priorities) on one connection,
// past the calls after which Postgres may switch the statement to its
// generic plan: every line's tasks take consecutive turns, in input order.
func TestSubmitManyTurnsOnOneConnection(t *testing.T) {
	t.Parallel()
	_, db := setup(t)
	cfg, err := pgxpool.ParseConfig(db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := newStore(pool)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	type line struct {
		kind, tenant string
		priority     int
	}
	for call, size := range []int{1, 2, 3, 1, 50, 1, 7, 1, 1, 300, 2, 1} {
		batch := make([]NewTask, size)
		for i := range batch {
			if i > 0 && rng.IntN(10) == 0 {
				batch[i] = batch[rng.IntN(i)] // the same key again
				continue
			}
			nt := newTask(fmt.Sprintf("c%d-%d", call, i))
			nt.Kind = []string{"image", "audio"}[rng.IntN(2)]
			nt.Tenant = []string{"acme", "beta", "gamma"}[rng.IntN(3)]
			nt.Priority = rng.IntN(3)
			if rng.IntN(5) == 0 {
				nt.Params = nil
			}
			batch[i] = nt
		}
		res, err := s.SubmitMany(ctx, batch)
		if err != nil {
			t.Fatalf("call %d: %v", call, err)
		}
		ids := make([]string, 0, size)
		for i, r := range res {
			if r.Err != nil {
				t.Fatalf("call %d, item %d: %v", call, i, r.Err)
			}
			ids = append(ids, r.Task.ID)
		}
		turns := map[string]int64{}
		rows, _ := pool.Query(ctx, "SELECT id::text, turn FROM idemgate_tasks WHERE id = ANY($1::uuid[])", ids)
		var id string
		var turn int64
		if _, err := pgx.ForEachRow(rows, []any{&id, &turn}, func() error { turns[id] = turn; return nil }); err != nil {
			t.Fatal(err)
		}
		last, seen := map[line]int64{}, map[string]bool{}
		for i, r := range res {
			if seen[r.Task.ID] {
				continue
			}
			seen[r.Task.ID] = true
			l := line{batch[i].Kind, batch[i].Tenant, batch[i].Priority}
			if prev, ok := last[l]; ok && turns[r.Task.ID] != prev+1 {
				t.Errorf("call %d, item %d of line %v: turn %d after %d", call, i, l, turns[r.Task.ID], prev)
			}
			last[l] = turns[r.Task.ID]
		}
	}
}
