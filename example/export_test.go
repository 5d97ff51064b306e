package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/wait"
)

// succeededTask submits a prompt as alice and waits until it succeeded.
func (n *taskNode) succeededTask(t *testing.T, key, prompt string, images int) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "n": images})
	code, v := n.do(t, "alice", http.MethodPost, "/v1/images", key, string(body))
	if code != http.StatusAccepted {
		t.Fatalf("submit: %d %v", code, v)
	}
	id := v["task_id"].(string)
	n.waitStatus(t, id, "succeeded")
	return id
}

// exports counts the ledger rows of a task: the charges made for it.
func (n *taskNode) exports(t *testing.T, taskID string) int {
	t.Helper()
	ctx := context.Background()
	var exists bool
	if err := n.b.pool.QueryRow(ctx, `SELECT to_regclass('idemgate_example_exports') IS NOT NULL`).Scan(&exists); err != nil || !exists {
		return 0 // the route creates the ledger on its first export
	}
	var c int
	err := n.b.pool.QueryRow(ctx, `SELECT count(*) FROM idemgate_example_exports WHERE task_id = $1::uuid`, taskID).Scan(&c)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// exportAnswer is an answer to an export over HTTP.
type exportAnswer struct {
	status   int
	replayed bool
	size     int // body bytes
	view     exportView
	code     string
}

// exportOver sends POST /v1/tasks/{id}/export as alice to a real server.
func exportOver(ctx context.Context, t *testing.T, hc *http.Client, base, secret, taskID, key string) (exportAnswer, error) {
	t.Helper()
	tok, err := mintToken([]byte(secret), "acme", "alice", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/tasks/"+taskID+"/export", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Idempotency-Key", key)
	resp, err := hc.Do(req)
	if err != nil {
		return exportAnswer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return exportAnswer{}, err
	}
	a := exportAnswer{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true", size: len(b)}
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(b, &a.view)
	_ = json.Unmarshal(b, &p)
	a.code = p.Code
	return a, nil
}

func TestExportRoute(t *testing.T) {
	t.Parallel()
	n := newTaskNode(t)
	n.startWorkers(t, time.Millisecond)
	id := n.succeededTask(t, "poster:export", "a cat for the print shop", 3)
	srv := httptest.NewServer(n.e)
	t.Cleanup(srv.Close)
	ctx := context.Background()

	first, err := exportOver(ctx, t, srv.Client(), srv.URL, string(n.secret), id, "export:1")
	if err != nil {
		t.Fatal(err)
	}
	if first.status != http.StatusOK || first.replayed || first.view.TaskID != id || first.view.Images != 3 || first.view.ExportID == 0 {
		t.Fatalf("export: %+v; want 200 with 3 images, not replayed", first)
	}
	// Larger than a socket buffer, smaller than what the middleware stores.
	if first.size <= 64<<10 || first.size >= 1<<20 {
		t.Errorf("export answer is %d bytes; want between 64 KiB and 1 MiB", first.size)
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(first.view.Sheet, "data:image/png;base64,"))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("sheet: %v", err)
	}
	if b := img.Bounds(); b.Dx() != sheetCols*sheetCell || b.Dy() != 2*sheetCell || len(raw) != first.view.Bytes {
		t.Errorf("sheet %v of %d bytes (answer says %d); want %dx%d", b, len(raw), first.view.Bytes, sheetCols*sheetCell, 2*sheetCell)
	}

	// The same key again: the stored answer, no second charge.
	again, err := exportOver(ctx, t, srv.Client(), srv.URL, string(n.secret), id, "export:1")
	if err != nil {
		t.Fatal(err)
	}
	if again.status != http.StatusOK || !again.replayed || again.view.ExportID != first.view.ExportID || again.view.Sheet != first.view.Sheet {
		t.Fatalf("retry: %d replayed=%v export %d; want 200 replayed, export %d", again.status, again.replayed, again.view.ExportID, first.view.ExportID)
	}
	if c := n.exports(t, id); c != 1 {
		t.Fatalf("%d ledger rows after a retry; want 1", c)
	}
	// A new key is a new export, charged again.
	other, err := exportOver(ctx, t, srv.Client(), srv.URL, string(n.secret), id, "export:2")
	if err != nil || other.status != http.StatusOK || other.replayed || other.view.ExportID == first.view.ExportID {
		t.Fatalf("new key: %+v %v; want a new export", other, err)
	}
	if c := n.exports(t, id); c != 2 {
		t.Fatalf("%d ledger rows after two keys; want 2", c)
	}

	tests := []struct {
		name     string
		given    string // user
		when     string // task id
		want     int
		wantCode string
	}{
		{name: "another user's task", given: "bob", when: id, want: http.StatusNotFound, wantCode: "not_found"},
		{name: "no such task", given: "alice", when: "00000000-0000-0000-0000-000000000000", want: http.StatusNotFound, wantCode: "not_found"},
		{name: "a failed task", given: "alice", when: n.failedTask(t), want: http.StatusConflict, wantCode: "not_exportable"},
	}
	for _, tt := range tests {
		code, v := n.do(t, tt.given, http.MethodPost, "/v1/tasks/"+tt.when+"/export", "export:"+strings.ReplaceAll(tt.name, " ", "-"), "")
		if code != tt.want || v["code"] != tt.wantCode {
			t.Errorf("%s: %d %v; want %d %s", tt.name, code, v, tt.want, tt.wantCode)
		}
	}
	if code, v := n.do(t, "alice", http.MethodPost, "/v1/tasks/"+id+"/export", "", ""); code != http.StatusBadRequest {
		t.Errorf("no Idempotency-Key: %d %v; want 400", code, v)
	}
}

// failedTask submits a #fail prompt as alice and waits until it failed.
func (n *taskNode) failedTask(t *testing.T) string {
	t.Helper()
	code, v := n.do(t, "alice", http.MethodPost, "/v1/images", "poster:fail", `{"prompt":"a cat #fail"}`)
	if code != http.StatusAccepted {
		t.Fatalf("submit: %d %v", code, v)
	}
	id := v["task_id"].(string)
	n.waitStatus(t, id, "failed")
	return id
}

// TestExportClientLeaves: a client that gives up mid-export and retries
// under the same key gets the first run's answer; the export ran, and was
// charged, once. With the middleware releasing the claim instead of
// storing the answer when the client is gone (the chaos plant
// release-on-client-gone), the retry runs the export again.
func TestExportClientLeaves(t *testing.T) {
	t.Parallel()
	n := newTaskNode(t)
	n.startWorkers(t, time.Millisecond)
	id := n.succeededTask(t, "poster:leave", "a cat that leaves early", 4)
	srv := httptest.NewServer(n.e)
	t.Cleanup(srv.Close)
	ctx := context.Background()

	impatient := &http.Client{Timeout: exportRenderTime / 3}
	if a, err := exportOver(ctx, t, impatient, srv.URL, string(n.secret), id, "export:leave"); err == nil {
		t.Fatalf("the impatient client got %+v; want its timeout (the export takes %v)", a, exportRenderTime)
	}
	// The first run goes on without its client; let it end before the
	// retry, so the retry meets its stored answer (or, planted, nothing).
	// Its charge is in the ledger before the middleware has stored its
	// answer, hundreds of KiB: on a loaded machine that can take longer
	// than the sleep, and the retry then meets the run still in progress
	// (409 request_in_progress), which a client waits out as the SDKs do.
	wait.For(t, time.Minute, "the first export run to end", func() bool { return n.exports(t, id) == 1 })
	time.Sleep(exportRenderTime)
	var a exportAnswer
	wait.For(t, time.Minute, "the retry to get an answer, not request_in_progress", func() bool {
		var err error
		if a, err = exportOver(ctx, t, srv.Client(), srv.URL, string(n.secret), id, "export:leave"); err != nil {
			t.Fatal(err)
		}
		if a.status == http.StatusConflict && a.code == string(idemgate.CodeRequestInProgress) {
			time.Sleep(50 * time.Millisecond)
			return false
		}
		return true
	})
	if a.status != http.StatusOK || !a.replayed {
		t.Errorf("retry: %d %s replayed=%v; want the stored 200", a.status, a.code, a.replayed)
	}
	if c := n.exports(t, id); c != 1 {
		t.Fatalf("the export ran %d times for one key; want once", c)
	}
}

// TestExportConcurrent: many clients, some giving up mid-export, send the
// same key at once and retry until answered; every answer is the same
// export and the ledger holds one charge.
func TestExportConcurrent(t *testing.T) {
	t.Parallel()
	n := newTaskNode(t)
	n.startWorkers(t, time.Millisecond)
	id := n.succeededTask(t, "poster:many", "many cats", 1)
	srv := httptest.NewServer(n.e)
	t.Cleanup(srv.Close)
	ctx := context.Background()

	const clients = 16
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		ids = map[int64]int{}
	)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := srv.Client()
			if i%2 == 0 {
				hc = &http.Client{Timeout: time.Duration(10*(i+1)) * time.Millisecond}
			}
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) {
				a, err := exportOver(ctx, t, hc, srv.URL, string(n.secret), id, "export:same")
				switch {
				case err != nil && errors.Is(err, context.DeadlineExceeded) || err != nil && strings.Contains(err.Error(), "Timeout"):
					hc = srv.Client() // gave up once; retry patiently
					continue
				case err != nil:
					t.Error(err)
					return
				case a.status == http.StatusConflict && a.code == string(idemgate.CodeRequestInProgress):
					time.Sleep(50 * time.Millisecond)
					continue
				case a.status != http.StatusOK:
					t.Errorf("export: %+v", a)
					return
				}
				mu.Lock()
				ids[a.view.ExportID]++
				mu.Unlock()
				return
			}
			t.Error("no answer within 30 s")
		}()
	}
	wg.Wait()
	if len(ids) != 1 {
		t.Errorf("answers name exports %v; want one export", ids)
	}
	if c := n.exports(t, id); c != 1 {
		t.Fatalf("%d ledger rows for one key; want 1", c)
	}
}

// doAs is taskNode.do for a user of any tenant.
func (n *taskNode) doAs(t *testing.T, tenant, user, method, path, key, body string) (int, map[string]any) {
	t.Helper()
	tok, err := mintToken(n.secret, tenant, user, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	rec := httptest.NewRecorder()
	n.e.ServeHTTP(rec, req)
	var v map[string]any
	_ = json.Unmarshal(rec.Body.Bytes(), &v)
	return rec.Code, v
}

// succeededTaskOf submits a one-image prompt as tenant/user and waits
// until it succeeded.
func (n *taskNode) succeededTaskOf(t *testing.T, tenant, user string) string {
	t.Helper()
	code, v := n.doAs(t, tenant, user, http.MethodPost, "/v1/images", "poster:"+tenant, `{"prompt":"a cat for `+tenant+`"}`)
	if code != http.StatusAccepted {
		t.Fatalf("submit: %d %v", code, v)
	}
	id := v["task_id"].(string)
	deadline := time.Now().Add(time.Minute)
	for {
		if _, v := n.doAs(t, tenant, user, http.MethodGet, "/v1/tasks/"+id, "", ""); v["status"] == "succeeded" {
			return id
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s of %s did not succeed", id, tenant)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// An export_id tells its tenant nothing of other tenants' exports: the
// ids of acme's exports do not count globex's in between.
func TestExportIDTellsNothingOfOtherTenants(t *testing.T) {
	t.Parallel()
	n := newTaskNode(t)
	n.startWorkers(t, time.Millisecond)
	acme, globex := n.succeededTaskOf(t, "acme", "alice"), n.succeededTaskOf(t, "globex", "gina")
	export := func(tenant, user, task, key string) int64 {
		t.Helper()
		code, v := n.doAs(t, tenant, user, http.MethodPost, "/v1/tasks/"+task+"/export", key, "")
		id, _ := v["export_id"].(float64)
		if code != http.StatusOK || id == 0 {
			t.Fatalf("export %s as %s: %d %v", key, tenant, code, v["code"])
		}
		return int64(id)
	}
	first := export("acme", "alice", acme, "export:a1")
	const others = 3
	for i := range others {
		export("globex", "gina", globex, "export:g"+strconv.Itoa(i))
	}
	second := export("acme", "alice", acme, "export:a2")
	if second == first || second-first == others+1 {
		t.Errorf("acme's export ids %d then %d count globex's %d exports in between", first, second, others)
	}
	// JavaScript reads JSON numbers as doubles: an id must survive that.
	for _, id := range []int64{first, second} {
		if id <= 0 || id > 1<<53 {
			t.Errorf("export_id %d outside (0, 2^53]", id)
		}
	}
}
