package pgstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemgate/idemgate/internal/wait"
)

// goKeyDigest is the digest v12's index holds for a full key, computed
// as the package documents it: SHA-256 of the four texts joined by NUL
// bytes.
func goKeyDigest(tenant, key, runtime, network string) []byte {
	sum := sha256.Sum256([]byte(strings.Join([]string{tenant, key, runtime, network}, "\x00")))
	return sum[:]
}

// The arbiter of a migrated schema is one unique index on key_digest,
// and every row's digest is the 32-byte SHA-256 of its full key, whoever
// wrote the row: a Store (which computes it in Go), a writer that leaves
// it out, or one that changes a key column (the triggers compute it).
func TestSubmitArbitratesOnTheFullKeysDigest(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	if got, want := keyIndexes(t, s.pool), []keyIndex{{Name: indexKeyDigest, Usable: true, Columns: []string{"key_digest"}}}; !slicesEqualFunc(got, want) {
		t.Fatalf("unique indexes of the tasks = %+v; want %+v", got, want)
	}
	digestOf := func(id string) []byte {
		t.Helper()
		var got []byte
		if err := s.pool.QueryRow(ctx, `SELECT key_digest FROM idemgate_tasks WHERE id = $1::uuid`, id).Scan(&got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	nt := tenantTask(`ten\ant é`, `key\000with\\backslashes`)
	task := mustSubmit(t, s, nt)
	want := goKeyDigest(nt.Tenant, nt.IdempotencyKey, nt.Runtime, nt.Network)
	if got := digestOf(task.ID); !bytes.Equal(got, want) {
		t.Fatalf("Submit's digest of %q = %x; want %x (SHA-256 of the NUL-joined key)", nt.IdempotencyKey, got, want)
	}
	// A writer that leaves the digest out: the trigger computes the same.
	var id string
	if err := s.pool.QueryRow(ctx, `INSERT INTO idemgate_tasks (tenant, owner, kind, runtime, network, idempotency_key, fingerprint)
		VALUES ($1, 'o', 'k', $2, $3, 'by hand', 'f') RETURNING id::text`, nt.Tenant, nt.Runtime, nt.Network).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if got, want := digestOf(id), goKeyDigest(nt.Tenant, "by hand", nt.Runtime, nt.Network); !bytes.Equal(got, want) {
		t.Fatalf("the trigger's digest = %x; want %x", got, want)
	}
	// A writer that changes a key column, or clears the digest.
	for _, update := range []string{`UPDATE idemgate_tasks SET idempotency_key = 'moved' WHERE id = $1::uuid`,
		`UPDATE idemgate_tasks SET key_digest = NULL WHERE id = $1::uuid`,
		`UPDATE idemgate_tasks SET key_digest = '\x00' WHERE id = $1::uuid`} {
		if _, err := s.pool.Exec(ctx, update, id); err != nil {
			t.Fatal(err)
		}
		if got, want := digestOf(id), goKeyDigest(nt.Tenant, "moved", nt.Runtime, nt.Network); !bytes.Equal(got, want) {
			t.Fatalf("after %s: digest = %x; want %x", update, got, want)
		}
	}
	// The database itself refuses a second row of the key, whoever writes it.
	_, err := s.pool.Exec(ctx, `INSERT INTO idemgate_tasks (tenant, owner, kind, runtime, network, idempotency_key, fingerprint)
		VALUES ($1, 'o', 'k', $2, $3, $4, 'f')`, nt.Tenant, nt.Runtime, nt.Network, nt.IdempotencyKey)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" || pgErr.ConstraintName != indexKeyDigest {
		t.Fatalf("a second row of the key by hand: %v; want a unique violation on %s", err, indexKeyDigest)
	}
}

// Keys that differ only in where one field ends and the next begins, or
// in backslashes and escapes the digest's decoding gives meaning to, are
// different keys; the same key, however odd, is one.
func TestSubmitTellsKeysApartThatJoinAlike(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	ctx := context.Background()
	type key struct{ tenant, key, runtime, network string }
	tests := []struct {
		name string
		a, b key
	}{
		{"a letter moves from tenant to key", key{"ab", "c", "r", "n"}, key{"a", "bc", "r", "n"}},
		{"a letter moves from key to runtime", key{"t", "kr", "x", "n"}, key{"t", "k", "rx", "n"}},
		{"a letter moves from runtime to network", key{"t", "k", "rn", "x"}, key{"t", "k", "r", "nx"}},
		{"an escaped NUL against a field boundary", key{`t\000k`, "x", "r", "n"}, key{"t", "k", "r", "n"}},
		{"a trailing backslash against a leading one", key{`t\`, "k", "r", "n"}, key{"t", `\k`, "r", "n"}},
		{"one backslash against two", key{"t", `k\`, "r", "n"}, key{"t", `k\\`, "r", "n"}},
		{"an octal escape against its byte", key{"t", `k\101`, "r", "n"}, key{"t", "kA", "r", "n"}},
		{"case", key{"t", "K", "r", "n"}, key{"t", "k", "r", "n"}},
		{"empty runtime and network moved", key{"t", "k", "", "n"}, key{"t", "k", "n", ""}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var ids []string
			for j, k := range []key{tc.a, tc.b} {
				nt := tenantTask(fmt.Sprintf("%d-%s", i, k.tenant), k.key)
				nt.Runtime, nt.Network = k.runtime, k.network
				got, err := s.Submit(ctx, nt)
				if err != nil {
					t.Fatalf("key %d: %v", j, err)
				}
				if got.Duplicate {
					t.Fatalf("key %d %+v came back as a duplicate of %+v", j, k, ids)
				}
				again, err := s.Submit(ctx, nt)
				if err != nil || !again.Duplicate || again.ID != got.ID {
					t.Fatalf("key %d again: %+v, %v; want the duplicate %s", j, again, err, got.ID)
				}
				ids = append(ids, got.ID)
			}
		})
	}
}

// A Store follows the arbiter across v12: on a schema before v12 it
// names the key's columns (after one statement that named the digest),
// and once v12 replaced that index it names the digest again; every
// Submit, SubmitTx and SubmitMany on the way finds the keys stored
// before.
func TestSubmitFollowsTheArbiterAcrossV12(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx := context.Background()
	s := newStore(db.pool(t))
	s.test = &storeTestHooks{migrateSkip: []int{12}}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	s.test = nil
	submitAll := func(round string, wantDuplicate bool) {
		t.Helper()
		first := mustSubmit(t, s, tenantTask("acme", "one"))
		if first.Duplicate != wantDuplicate {
			t.Fatalf("%s: Submit of a key: duplicate %v; want %v", round, first.Duplicate, wantDuplicate)
		}
		var tx Task
		if err := pgx.BeginFunc(ctx, s.pool, func(t2 pgx.Tx) error {
			var err error
			tx, err = s.SubmitTx(ctx, t2, tenantTask("acme", "two"))
			return err
		}); err != nil {
			t.Fatalf("%s: SubmitTx: %v", round, err)
		}
		if tx.Duplicate != wantDuplicate {
			t.Fatalf("%s: SubmitTx: duplicate %v; want %v", round, tx.Duplicate, wantDuplicate)
		}
		res, err := s.SubmitMany(ctx, []NewTask{tenantTask("acme", "three"), tenantTask("acme", "one")})
		if err != nil {
			t.Fatalf("%s: SubmitMany: %v", round, err)
		}
		if res[0].Err != nil || res[0].Task.Duplicate != wantDuplicate || res[1].Err != nil || !res[1].Task.Duplicate || res[1].Task.ID != first.ID {
			t.Fatalf("%s: SubmitMany: %+v", round, res)
		}
	}
	submitAll("before v12", false)
	if !s.arbiter.columns.Load() {
		t.Fatal("before v12 the Store names the digest's index, which is not there")
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	submitAll("after v12", true)
	if s.arbiter.columns.Load() {
		t.Fatal("after v12 the Store still names the columns' index, which v12 dropped")
	}
	fresh := mustSubmit(t, s, tenantTask("acme", "four"))
	if fresh.Duplicate {
		t.Fatal("a new key after v12 came back as a duplicate")
	}
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM idemgate_tasks`).Scan(&n); err != nil || n != 4 {
		t.Fatalf("%d tasks (%v); want 4", n, err)
	}
}

// TestMigrateV12KilledMidBuildWhileSubmitting kills the migrating
// connection while v12's CREATE INDEX CONCURRENTLY waits for a writer,
// with Submits and SubmitManys of the same keys running on Stores made
// before v12 all along, then reruns it under the same load: every key
// keeps one task, and no call fails.
func TestMigrateV12KilledMidBuildWhileSubmitting(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	admin := db.pool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	s := newStore(db.pool(t))
	s.test = &storeTestHooks{migrateSkip: []int{12}}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}

	var (
		stop      = make(chan struct{})
		submitted atomic.Int64
		wg        sync.WaitGroup
		mu        sync.Mutex
		ids       = map[string]map[string]bool{} // key → IDs seen
		errs      []error
	)
	record := func(k, id string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, err)
			return
		}
		if ids[k] == nil {
			ids[k] = map[string]bool{}
		}
		ids[k][id] = true
	}
	for g := range 6 {
		st := newStore(db.pool(t))
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				nt := newTask(fmt.Sprintf("key-%d", (n+g)%40))
				if g%2 == 0 {
					got, err := st.Submit(ctx, nt)
					record(nt.IdempotencyKey, got.ID, err)
				} else {
					batch := []NewTask{nt, newTask(fmt.Sprintf("key-%d", (n+g+7)%40))}
					res, err := st.SubmitMany(ctx, batch)
					for i, r := range res {
						record(batch[i].IdempotencyKey, r.Task.ID, r.Err)
					}
					if err != nil {
						record("", "", err)
					}
				}
				submitted.Add(1)
			}
		})
	}
	wait.For(t, patience, "submits run", func() bool { return submitted.Load() > 50 })

	killed := make(chan struct{})
	var blocker pgx.Tx
	s.test = &storeTestHooks{migrateStep: func(hctx context.Context, step string, pid uint32) {
		if step != "v12: build the digest index concurrently" {
			return
		}
		var err error
		if blocker, err = admin.Begin(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := blocker.Exec(ctx, `INSERT INTO idemgate_tasks
			(tenant, owner, kind, runtime, network, idempotency_key, fingerprint)
			VALUES ('blocker', 'o', 'k', 'r', 'n', 'blocker', 'f')`); err != nil {
			t.Fatal(err)
		}
		go func() {
			defer close(killed)
			ok := wait.Until(patience, func() bool {
				var waiting bool
				err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_class WHERE relname = $1)
					AND EXISTS (SELECT FROM pg_stat_activity WHERE pid = $2 AND wait_event_type = 'Lock')`,
					indexKeyDigest, int(pid)).Scan(&waiting)
				return err == nil && waiting
			})
			before := submitted.Load()
			ok = ok && wait.Until(patience, func() bool { return submitted.Load() > before+50 })
			if !ok {
				t.Error("the build never waited, or submits stalled during it")
			}
			terminate(t, admin, pid)
		}()
	}}
	if err := s.Migrate(ctx); err == nil {
		t.Fatal("Migrate succeeded although killed mid-build")
	}
	<-killed
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if idx := keyIndexes(t, admin); !slices.ContainsFunc(idx, func(k keyIndex) bool { return k.Name == indexKeyDigest && !k.Usable }) {
		t.Fatalf("no invalid leftover of the killed build: %+v", idx)
	}
	assertKeyGuarded(t, admin)

	before := submitted.Load()
	s.test = nil
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("rerun: %v", err)
	}
	wait.For(t, patience, "submits go on after the migration", func() bool { return submitted.Load() > before+200 })
	close(stop)
	wg.Wait()
	assertFinalSchema(t, admin)
	assertKeyGuarded(t, admin)
	if len(errs) > 0 {
		t.Fatalf("%d submits failed, first: %v", len(errs), errs[0])
	}
	for k, seen := range ids {
		if len(seen) != 1 {
			t.Errorf("key %s got %d task IDs: %v", k, len(seen), seen)
		}
	}
	var dup int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM (SELECT FROM idemgate_tasks
		GROUP BY tenant, idempotency_key, runtime, network HAVING count(*) > 1) d`).Scan(&dup); err != nil {
		t.Fatal(err)
	}
	if dup != 0 {
		t.Fatalf("%d keys have more than one task", dup)
	}
}
