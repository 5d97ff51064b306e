package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// TestAtomicExportPoolNoDeadlock: under STORE=postgres the export is
// Atomic; its handler reads the task (store.Get) and prepares the ledger
// on other connections of the same pool. With as many exports at once as
// the pool has connections, all must succeed: a transaction takes its
// connection with the handler's first statement, not before, and at most
// MaxConns-1 transactions hold one, so a handler's pool reads always find
// one. (When Begin took the connection, every connection was held by a
// transaction whose handler waited for another one, until exportBudget
// failed them all with 503.)
func TestAtomicExportPoolNoDeadlock(t *testing.T) {
	t.Parallel()
	n := newAtomicNode(t)
	n.startWorkers(t, time.Millisecond)
	id := n.succeededTask(t, "gen:pool", "a lighthouse", 1)
	conns := int(n.b.pool.Config().MaxConns)
	tok, err := mintToken(n.secret, "acme", "alice", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	codes := make([]int, conns)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() {
			req := httptest.NewRequest(http.MethodPost, "/v1/tasks/"+id+"/export", nil)
			req.Header.Set("Authorization", "Bearer "+tok)
			req.Header.Set("Idempotency-Key", fmt.Sprintf("export:pool:%d", i))
			rec := httptest.NewRecorder()
			n.e.ServeHTTP(rec, req)
			codes[i] = rec.Code
		})
	}
	wg.Wait()
	for i := range conns {
		if codes[i] != http.StatusOK {
			t.Errorf("export %d of %d at once (pool of %d) = %d", i, conns, conns, codes[i])
		}
	}
}
