package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/opsbench"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/pgrecords"
)

// dyingCommit is a TxStore whose commits fail while fail is set, the way a
// node that dies, or loses Postgres, at its commit fails them: the
// transaction rolls back and the client gets no 2xx.
type dyingCommit struct {
	idemgate.TxStore
	fail atomic.Bool
}

func (s *dyingCommit) Begin(ctx context.Context) (idemgate.Tx, error) {
	tx, err := s.TxStore.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &dyingTx{Tx: tx, s: s}, nil
}

type dyingTx struct {
	idemgate.Tx
	s *dyingCommit
}

func (t *dyingTx) Commit(ctx context.Context, c *idemgate.Completion) error {
	if t.s.fail.Load() {
		_ = t.Tx.Rollback(ctx)
		return errors.New("connection lost at commit")
	}
	return t.Tx.Commit(ctx, c)
}

// atomicNode is the API with STORE=postgres: records in the tasks'
// database, the image submit and the export on Atomic routes.
type atomicNode struct {
	taskNode
	records *dyingCommit
}

func newAtomicNode(t *testing.T) *atomicNode {
	t.Helper()
	ctx := context.Background()
	pool, store := opsbench.Migrated(t, testenv.PostgresDSN(t))
	recs, err := pgrecords.New(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := recs.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	records := &dyingCommit{TxStore: recs}
	secret := []byte("s3cret")
	a := &api{store: store, pool: pool, records: records, secret: secret, logger: slog.New(slog.DiscardHandler)}
	return &atomicNode{taskNode: taskNode{b: &backends{pool: pool, store: store}, e: a.handler(), secret: secret}, records: records}
}

func (n *atomicNode) count(t *testing.T, sql string) int {
	t.Helper()
	var c int
	if err := n.b.pool.QueryRow(context.Background(), sql).Scan(&c); err != nil {
		t.Fatal(err)
	}
	return c
}

// Under STORE=postgres the image submit is Atomic: a task is created
// exactly when its 202 is stored. A commit that fails leaves neither, and
// the retry creates the one task and stores its answer.
func TestAtomicImageSubmit(t *testing.T) {
	t.Parallel()
	n := newAtomicNode(t)
	const body = `{"prompt":"a lighthouse at dawn","aspect_ratio":"16:9","n":1}`

	n.records.fail.Store(true)
	if code, v := n.do(t, "alice", http.MethodPost, "/v1/images", "atomic:1", body); code/100 == 2 {
		t.Fatalf("a submit whose commit failed answered %d %v", code, v)
	}
	if c := n.count(t, `SELECT count(*) FROM idemgate_tasks`); c != 0 {
		t.Fatalf("%d tasks after a failed commit, want 0: the task must commit with its answer", c)
	}
	n.records.fail.Store(false)
	code, first := n.do(t, "alice", http.MethodPost, "/v1/images", "atomic:1", body)
	if code != http.StatusAccepted {
		t.Fatalf("retry: %d %v", code, first)
	}
	code, again := n.do(t, "alice", http.MethodPost, "/v1/images", "atomic:1", body)
	if code != http.StatusAccepted || again["task_id"] != first["task_id"] {
		t.Fatalf("replay: %d %v, want the first answer %v", code, again, first)
	}
	if c := n.count(t, `SELECT count(*) FROM idemgate_tasks`); c != 1 {
		t.Fatalf("%d tasks, want 1", c)
	}
	if c := n.count(t, `SELECT count(*) FROM idemgate_records WHERE finished`); c != 1 {
		t.Fatalf("%d finished records, want 1", c)
	}
}

// Under STORE=postgres the export is Atomic: its ledger row (the charge)
// commits with the stored answer. A commit that fails charges nothing; the
// retry charges once, and its replay charges nothing more.
func TestAtomicExport(t *testing.T) {
	t.Parallel()
	n := newAtomicNode(t)
	n.startWorkers(t, time.Millisecond)
	id := n.succeededTask(t, "gen:1", "a lighthouse", 2)

	export := func() (int, string) {
		req := httptest.NewRequest(http.MethodPost, "/v1/tasks/"+id+"/export", nil)
		tok, err := mintToken(n.secret, "acme", "alice", time.Now(), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Idempotency-Key", "export:1")
		rec := httptest.NewRecorder()
		n.e.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	n.records.fail.Store(true)
	if code, body := export(); code/100 == 2 {
		t.Fatalf("an export whose commit failed answered %d %s", code, body)
	}
	if c := n.exports(t, id); c != 0 {
		t.Fatalf("%d charges after a failed commit, want 0", c)
	}
	n.records.fail.Store(false)
	code, first := export()
	code2, again := export()
	if code != http.StatusOK || code2 != http.StatusOK || first != again {
		t.Fatalf("export %d, replay %d (same body: %v)", code, code2, first == again)
	}
	var v exportView
	if err := json.Unmarshal([]byte(first), &v); err != nil || !strings.HasPrefix(v.Sheet, "data:image/png;base64,") {
		t.Fatalf("export body: %v %.80s", err, first)
	}
	if c := n.exports(t, id); c != 1 {
		t.Fatalf("%d charges, want 1", c)
	}
}
