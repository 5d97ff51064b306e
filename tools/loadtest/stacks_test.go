package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/pgstore"
)

// TestStacksSubmitTheSameTask: every stack's handler does the same task
// work, a pgstore.Submit into pgstore's table, with columns of the same
// shape as the idemgate stack's, so the stacks differ only in the
// idempotency layer.
func TestStacksSubmitTheSameTask(t *testing.T) {
	ro := testenv.Redis(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o := options{concurrency: 2, pgConns: 2, stacks: stackOrder,
		redisURL:    fmt.Sprintf("redis://%s/%d", ro.Addr, ro.DB),
		databaseURL: testenv.PostgresDSN(t)}
	e, err := startEnv(ctx, o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	b := newBench(e, o, io.Discard)
	if err := b.start(ctx); err != nil {
		t.Fatal(err)
	}
	if len(b.stacks) != len(stackOrder) {
		t.Fatalf("%d stacks, want %d", len(b.stacks), len(stackOrder))
	}
	store, err := pgstore.New(ctx, e.db)
	if err != nil {
		t.Fatal(err)
	}
	tasks := map[string]pgstore.Task{}
	for _, st := range b.stacks {
		tenant := "lt-same-" + st.name
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, st.url+"/v1/images", bytes.NewReader(baseBody))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "same-1")
		req.Header.Set("X-Tenant", tenant)
		req.Header.Set("X-User", "user-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("%s: status %d: %s", st.name, resp.StatusCode, body)
		}
		if st.table != tasksTable {
			t.Errorf("%s: rows counted in %q, want pgstore's %q", st.name, st.table, tasksTable)
		}
		var owner string
		if err := e.db.QueryRow(ctx, `SELECT owner FROM idemgate_tasks WHERE tenant = $1`, tenant).Scan(&owner); err != nil {
			t.Fatalf("%s: its task is not in pgstore's table: %v", st.name, err)
		}
		task, err := store.Get(ctx, tenant, owner, taskID(body))
		if err != nil {
			t.Fatalf("%s: pgstore.Get of task %q: %v", st.name, taskID(body), err)
		}
		tasks[st.name] = task
	}
	want := tasks[idemgateName]
	for name, got := range tasks {
		if got.Kind != want.Kind || got.Runtime != want.Runtime || got.Network != want.Network ||
			got.State != want.State || !bytes.Equal(got.Params, want.Params) ||
			len(got.Owner) != len(want.Owner) || len(got.IdempotencyKey) != len(want.IdempotencyKey) ||
			len(got.Fingerprint) != len(want.Fingerprint) {
			g, _ := json.Marshal(got)
			w, _ := json.Marshal(want)
			t.Errorf("%s submitted\n%s\nidemgate submitted\n%s", name, g, w)
		}
	}
}
