package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func newTask(key string) NewTask {
	return NewTask{
		Tenant: "acme", Owner: "owner-a", Kind: "image", Runtime: "gpu", Network: "main",
		IdempotencyKey: key, Fingerprint: "v1:aaaa", Params: []byte(`{"prompt":"a cat"}`),
	}
}

func TestSubmitStormCreatesOneTask(t *testing.T) {
	t.Parallel()
	_, db := setup(t)
	ctx := context.Background()
	const pools, perPool = 4, 32
	var (
		start   = make(chan struct{})
		wg      sync.WaitGroup
		mu      sync.Mutex
		ids     = map[string]int{}
		created int
		errs    []error
	)
	for range pools {
		s := newStore(db.pool(t))
		for range perPool {
			wg.Go(func() {
				<-start
				got, err := s.Submit(ctx, newTask("storm"))
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				ids[got.ID]++
				if !got.Duplicate {
					created++
				}
			})
		}
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d submits failed, first: %v", len(errs), errs[0])
	}
	if len(ids) != 1 || created != 1 {
		t.Fatalf("got IDs %v and %d non-duplicates; want one ID and one non-duplicate", ids, created)
	}
	var rows int
	if err := db.pool(t).QueryRow(ctx, "SELECT count(*) FROM idemgate_tasks").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 1 {
		t.Fatalf("table has %d rows; want 1", rows)
	}
}

func TestSubmitComparesTheHolder(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	given := newTask("k1")
	first, err := s.Submit(ctx, given)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		when    func(*NewTask)
		wantErr error
		wantNew bool // a new task, not the first one
	}{
		{name: "identical retry replays", when: func(*NewTask) {}},
		{name: "other params under the same fingerprint replay", when: func(n *NewTask) { n.Params = []byte(`{"note":"x"}`) }},
		{name: "other fingerprint conflicts", when: func(n *NewTask) { n.Fingerprint = "v1:bbbb" }, wantErr: ErrConflict},
		{name: "fingerprint differing in case conflicts", when: func(n *NewTask) { n.Fingerprint = "V1:AAAA" }, wantErr: ErrConflict},
		{name: "other owner conflicts", when: func(n *NewTask) { n.Owner = "owner-b" }, wantErr: ErrConflict},
		{name: "other kind conflicts", when: func(n *NewTask) { n.Kind = "video" }, wantErr: ErrConflict},
		{name: "other runtime is a new task", when: func(n *NewTask) { n.Runtime = "cpu" }, wantNew: true},
		{name: "other network is a new task", when: func(n *NewTask) { n.Network = "test" }, wantNew: true},
		{name: "other tenant is a new task", when: func(n *NewTask) { n.Tenant = "globex" }, wantNew: true},
		{name: "other key is a new task", when: func(n *NewTask) { n.IdempotencyKey = "k2" }, wantNew: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nt := given
			tt.when(&nt)
			got, err := s.Submit(ctx, nt)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v; want %v", err, tt.wantErr)
			}
			if tt.wantErr != nil {
				if got.ID != "" {
					t.Fatalf("a conflict returned task %q; want nothing of the holder", got.ID)
				}
				return
			}
			if tt.wantNew {
				if got.ID == first.ID || got.Duplicate {
					t.Fatalf("got task %s duplicate=%v; want a new task", got.ID, got.Duplicate)
				}
				again, err := s.Submit(ctx, nt)
				if err != nil || again.ID != got.ID || !again.Duplicate {
					t.Fatalf("resubmit = %s, %v, %v; want %s as duplicate", again.ID, again.Duplicate, err, got.ID)
				}
				return
			}
			if got.ID != first.ID || !got.Duplicate || got.State != StatePending {
				t.Fatalf("got %s duplicate=%v state=%s; want %s as a duplicate", got.ID, got.Duplicate, got.State, first.ID)
			}
		})
	}
}

func TestSubmitRejectsIncompleteTasks(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	for _, field := range []string{"tenant", "owner", "kind", "key", "fingerprint"} {
		nt := newTask("k")
		switch field {
		case "tenant":
			nt.Tenant = ""
		case "owner":
			nt.Owner = ""
		case "kind":
			nt.Kind = ""
		case "key":
			nt.IdempotencyKey = ""
		case "fingerprint":
			nt.Fingerprint = ""
		}
		if _, err := s.Submit(context.Background(), nt); err == nil {
			t.Errorf("Submit without %s succeeded", field)
		}
	}
	nt := newTask("bad-json")
	nt.Params = []byte(`{"a":`)
	if _, err := s.Submit(context.Background(), nt); err == nil {
		t.Errorf("Submit with malformed params succeeded")
	}
}

func TestSubmitTxCommitsWithTheCaller(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	for _, commit := range []bool{false, true} {
		t.Run(fmt.Sprintf("commit=%v", commit), func(t *testing.T) {
			key := fmt.Sprintf("tx-%v", commit)
			tx, err := s.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			got, err := s.SubmitTx(ctx, tx, newTask(key))
			if err != nil {
				t.Fatal(err)
			}
			again, err := s.SubmitTx(ctx, tx, newTask(key))
			if err != nil || again.ID != got.ID || !again.Duplicate {
				t.Fatalf("second SubmitTx = %s, %v, %v; want %s as duplicate", again.ID, again.Duplicate, err, got.ID)
			}
			if _, err := s.SubmitTx(ctx, tx, func() NewTask { n := newTask(key); n.Fingerprint = "v1:other"; return n }()); !errors.Is(err, ErrConflict) {
				t.Fatalf("conflicting SubmitTx err = %v; want ErrConflict", err)
			}
			// The transaction is still usable after the conflict.
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
				t.Fatalf("tx unusable after SubmitTx: %v", err)
			}
			if commit {
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			} else if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			_, err = s.Get(ctx, "acme", "owner-a", got.ID)
			if commit && err != nil {
				t.Fatalf("Get after commit: %v", err)
			}
			if !commit && !errors.Is(err, ErrNotFound) {
				t.Fatalf("Get after rollback err = %v; want ErrNotFound", err)
			}
		})
	}
}

func TestGetIsScopedToTheOwner(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	task, err := s.Submit(ctx, newTask("mine"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name              string
		tenant, owner, id string
		wantErr           error
	}{
		{name: "owner reads it", tenant: "acme", owner: "owner-a", id: task.ID},
		{name: "another owner of the tenant", tenant: "acme", owner: "owner-b", id: task.ID, wantErr: ErrNotFound},
		{name: "same owner digest in another tenant", tenant: "globex", owner: "owner-a", id: task.ID, wantErr: ErrNotFound},
		{name: "unknown ID", tenant: "acme", owner: "owner-a", id: "00000000-0000-0000-0000-000000000000", wantErr: ErrNotFound},
		{name: "malformed ID", tenant: "acme", owner: "owner-a", id: "'; DROP TABLE x; --", wantErr: ErrNotFound},
		{name: "empty ID", tenant: "acme", owner: "owner-a", id: "", wantErr: ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.Get(ctx, tt.tenant, tt.owner, tt.id)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v; want %v", err, tt.wantErr)
			}
			if tt.wantErr == nil && (got.ID != task.ID || got.Fingerprint != task.Fingerprint) {
				t.Fatalf("got %+v; want task %s", got, task.ID)
			}
			if tt.wantErr != nil && got.ID != "" {
				t.Fatalf("a refused Get returned task %s", got.ID)
			}
		})
	}
}

// countRows counts the tasks matching a WHERE clause.
func countRows(t testing.TB, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, where string, args ...any) int {
	t.Helper()
	var n int
	if err := q.QueryRow(context.Background(), "SELECT count(*) FROM idemgate_tasks WHERE "+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestSubmitWakesListeners(t *testing.T) {
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
	mustSubmit(t, s, newTask("wake"))
	n, err := conn.Conn().WaitForNotification(ctx)
	if err != nil {
		t.Fatalf("no notification after Submit: %v", err)
	}
	if n.Payload != "image" {
		t.Fatalf("notified %q; want the kind", n.Payload)
	}
	if _, err := conn.Exec(ctx, "UNLISTEN *"); err != nil {
		t.Fatal(err)
	}
}

func TestSubmitAnnouncesBurstsOnce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		given time.Duration // since the last announcement; < 0: none yet
		kind  string
		want  bool
	}{
		{name: "first task of a kind", given: -1, kind: "image", want: true},
		{name: "inside the window", given: notifyEvery - time.Millisecond, kind: "image", want: false},
		{name: "window over", given: notifyEvery, kind: "image", want: true},
		{name: "another kind has its own window", given: time.Millisecond, kind: "video", want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var l notifyLimiter
			now := time.Hour
			if tt.given >= 0 {
				l.sent("image", now)
				now += tt.given
			}
			if got := l.due(tt.kind, now); got != tt.want {
				t.Fatalf("due(%q) = %v; want %v", tt.kind, got, tt.want)
			}
		})
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
