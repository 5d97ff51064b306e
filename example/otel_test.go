package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/pgstore"
)

// stdoutSpan is what the stdout trace exporter writes per span.
type stdoutSpan struct {
	Name        string
	SpanContext struct{ TraceID, SpanID string }
	Parent      struct{ TraceID, SpanID string }
	Attributes  []struct {
		Key   string
		Value struct{ Value any }
	}
}

// TestExampleTelemetry runs a node with traces on stdout and /metrics on
// the admin listener, submits one task and follows it: one trace holds the
// request, the claim, the submit, the complete and the worker's attempt;
// /metrics counts the request and the attempt and shows the kinds' limits.
func TestExampleTelemetry(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	var spansOut lockedBuffer
	s := settings{addr: "127.0.0.1:0", databaseURL: testenv.PostgresDSN(t), workers: 1, genTime: 100 * time.Millisecond, dev: true,
		obs: obsSettings{adminAddr: "127.0.0.1:0", adminExplicit: true, traces: "console", stdout: &spansOut}}
	n, err := startNode(context.Background(), s, slog.New(slog.DiscardHandler), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = n.shutdown()
		}
	})
	// Music (unused here) paused and limited: the limits reach /metrics.
	if err := n.b.store.SetKindLimits(context.Background(), kindMusic,
		pgstore.KindLimits{Paused: true, MaxRunning: 3, StartsPerSecond: 50}); err != nil {
		t.Fatal(err)
	}
	tok, err := mintToken([]byte(devSecret), "acme", "alice", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	first := do(t, http.MethodPost, n.url()+"/v1/images", tok, "otel:1", `{"prompt":"a lighthouse","n":1}`)
	if first.status != http.StatusAccepted {
		t.Fatalf("submit: %d %s", first.status, first.body)
	}
	id, _ := first.json(t)["task_id"].(string)
	if replay := do(t, http.MethodPost, n.url()+"/v1/images", tok, "otel:1", `{"prompt":"a lighthouse","n":1}`); replay.status != http.StatusAccepted {
		t.Fatalf("replay: %d %s", replay.status, replay.body)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := do(t, http.MethodGet, n.url()+"/v1/tasks/"+id, tok, "", "")
		if got.json(t)["status"] == "succeeded" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("task not done: %s", got.body)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The attempt's outcome event follows the task's state by a moment.
	var page string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		res, err := http.Get(n.admin.url() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		page = string(b)
		if strings.Contains(page, `idemgate_task_attempts_total{idemgate_task_kind="images",idemgate_task_outcome="succeeded"} 1`) ||
			time.Now().After(deadline) {
			break
		}
	}
	for _, want := range []string{
		`idemgate_requests_total{http_request_method="POST",http_route="/v1/images",idemgate_kind="images",idemgate_outcome="claimed"} 1`,
		`idemgate_requests_total{http_request_method="POST",http_route="/v1/images",idemgate_kind="images",idemgate_outcome="replayed"} 1`,
		`idemgate_task_attempts_total{idemgate_task_kind="images",idemgate_task_outcome="succeeded"} 1`,
		`idemgate_tasks{idemgate_task_kind="images",idemgate_task_state="pending"} 0`,
		`idemgate_store_duration_seconds_count{idemgate_operation="complete",idemgate_result="ok"} 1`,
		`idemgate_task_paused{idemgate_task_kind="images"} 0`,
		`idemgate_task_paused{idemgate_task_kind="music"} 1`,
		`idemgate_task_limit_max_running{idemgate_task_kind="music"} 3`,
		`idemgate_task_limit_starts_per_second{idemgate_task_kind="music"} 50`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// Shutting down flushes the spans.
	stopped = true
	if err := n.shutdown(); err != nil {
		t.Fatal(err)
	}
	spans := map[string]stdoutSpan{}
	dec := json.NewDecoder(strings.NewReader(spansOut.String()))
	for {
		var sp stdoutSpan
		if err := dec.Decode(&sp); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("stdout spans: %v", err)
		}
		if _, seen := spans[sp.Name]; !seen { // the first request's spans come first
			spans[sp.Name] = sp
		}
	}
	server := spans["POST /v1/images"]
	for _, c := range []struct{ child, parent string }{
		{"idemgate.claim", "POST /v1/images"},
		{"idemgate.task.submit", "POST /v1/images"},
		{"idemgate.complete", "POST /v1/images"},
		{"idemgate.task.attempt", "idemgate.task.submit"},
	} {
		child, ok := spans[c.child]
		parent, ok2 := spans[c.parent]
		if !ok || !ok2 {
			t.Fatalf("missing span %s or %s; have %v", c.child, c.parent, keys(spans))
		}
		if child.SpanContext.TraceID != server.SpanContext.TraceID || child.Parent.SpanID != parent.SpanContext.SpanID {
			t.Errorf("%s (trace %s, parent %s) is not a child of %s (trace %s, span %s)", c.child,
				child.SpanContext.TraceID, child.Parent.SpanID, c.parent, parent.SpanContext.TraceID, parent.SpanContext.SpanID)
		}
	}
	for _, sp := range spans {
		for _, kv := range sp.Attributes {
			if v, _ := kv.Value.Value.(string); strings.Contains(v, "otel:1") || strings.Contains(v, "alice") || strings.Contains(v, "lighthouse") {
				t.Errorf("span %s attribute %s carries the key, user or prompt: %q", sp.Name, kv.Key, v)
			}
		}
	}
}

func keys(m map[string]stdoutSpan) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
