package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/example/imageclient"
	"github.com/idemgate/idemgate/internal/proctest"
)

// TestService runs the seed's scenario end to end on two serve nodes and
// one worker process sharing one real Redis and one real Postgres.
func TestService(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds the binary and starts processes")
	}
	// The only test of this binary on the shared redis-server, so its
	// FLUSHALL disturbs no one.
	t.Parallel()
	d := startDeployment(t)
	alice := token(t, "acme", "alice")
	newClient := func(base string) *imageclient.Client {
		return imageclient.New(imageclient.Config{BaseURL: base, Token: alice, MinBackoff: 50 * time.Millisecond})
	}
	submit := func(t *testing.T, node *proc, key, body string) call {
		t.Helper()
		return do(t, http.MethodPost, node.url+"/v1/images", alice, key, body)
	}
	const body = `{"prompt":"a lighthouse at dawn","aspect_ratio":"16:9","n":2}`
	const reworded = `{"prompt":"a lighthouse at dusk","aspect_ratio":"16:9","n":2}`

	// Runs alone: it flushes Redis, which would disturb the others.
	t.Run("redis flushed between a request and its retry: still one task", func(t *testing.T) {
		first := submit(t, d.a, "flush:1", body)
		if first.status != http.StatusAccepted {
			t.Fatalf("first submit: %d %s", first.status, first.body)
		}
		flush := d.redis.FlushDB
		if d.ownsRDB {
			flush = d.redis.FlushAll
		}
		if err := flush(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		retry := submit(t, d.b, "flush:1", body)
		if retry.status != http.StatusAccepted {
			t.Fatalf("retry after flush: %d %s", retry.status, retry.body)
		}
		if retry.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("the retry was replayed from Redis: the flush did not take")
		}
		if got, want := retry.json(t)["task_id"], first.json(t)["task_id"]; got != want {
			t.Errorf("retry after flush got task %v, want the same task %v", got, want)
		}
		if n, ids := rowsForKey(t, d.dsn, "acme", "alice", "flush:1", kindImages); n != 1 {
			t.Errorf("%d task rows for the key, want 1: %v", n, ids)
		}

		// With Redis empty again, Postgres alone refuses drifted parameters.
		if err := flush(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		drift := submit(t, d.a, "flush:1", reworded)
		if drift.status != http.StatusConflict || drift.json(t)["code"] != string(idemgate.CodeKeyReused) {
			t.Errorf("drift after flush: %d %s, want 409 key_reused", drift.status, drift.body)
		}
		if n, _ := rowsForKey(t, d.dsn, "acme", "alice", "flush:1", kindImages); n != 1 {
			t.Errorf("%d task rows after drift, want 1", n)
		}
	})

	t.Run("parallel", func(t *testing.T) {
		t.Run("a retry on the other node replays", func(t *testing.T) {
			t.Parallel()
			first := submit(t, d.a, "replay:1", body)
			if first.status != http.StatusAccepted {
				t.Fatalf("first submit: %d %s", first.status, first.body)
			}
			id, _ := first.json(t)["task_id"].(string)
			if loc := first.header.Get("Location"); loc != "/v1/tasks/"+id || first.header.Get("Retry-After") == "" {
				t.Errorf("Location %q, Retry-After %q; want /v1/tasks/%s and a delay", loc, first.header.Get("Retry-After"), id)
			}
			for _, node := range []*proc{d.b, d.a} {
				again := submit(t, node, "replay:1", body)
				if again.status != http.StatusAccepted || !bytes.Equal(again.body, first.body) {
					t.Errorf("retry: %d %s, want 202 %s", again.status, again.body, first.body)
				}
				if again.header.Get("Idempotent-Replayed") != "true" {
					t.Errorf("retry lacks Idempotent-Replayed: true")
				}
			}
		})

		t.Run("drifted parameters are 409 with nothing of the first answer", func(t *testing.T) {
			t.Parallel()
			first := submit(t, d.a, "drift:1", body)
			id, _ := first.json(t)["task_id"].(string)
			drift := submit(t, d.b, "drift:1", reworded)
			if drift.status != http.StatusConflict || drift.json(t)["code"] != string(idemgate.CodeKeyReused) {
				t.Fatalf("drift: %d %s, want 409 key_reused", drift.status, drift.body)
			}
			if ct := drift.header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type %q", ct)
			}
			if bytes.Contains(drift.body, []byte(id)) || bytes.Contains(drift.body, []byte("task_id")) ||
				drift.header.Get("Location") != "" || drift.header.Get("Idempotent-Replayed") != "" {
				t.Errorf("409 leaks the stored answer: %v %s", drift.header, drift.body)
			}
			if n, _ := rowsForKey(t, d.dsn, "acme", "alice", "drift:1", kindImages); n != 1 {
				t.Errorf("%d task rows, want 1", n)
			}
		})

		t.Run("40 concurrent duplicates across both nodes make one task", func(t *testing.T) {
			t.Parallel()
			const n = 40
			calls := make([]call, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range n {
				node := d.a
				if i%2 == 1 {
					node = d.b
				}
				wg.Go(func() {
					<-start
					calls[i] = submit(t, node, "storm:1", body)
				})
			}
			close(start)
			wg.Wait()
			ids := map[any]int{}
			for i, c := range calls {
				switch {
				case c.status == http.StatusAccepted:
					ids[c.json(t)["task_id"]]++
				case c.status == http.StatusConflict && c.json(t)["code"] == string(idemgate.CodeRequestInProgress):
					// allowed: the duplicate outwaited WaitInFlight
				default:
					t.Errorf("call %d: %d %s", i, c.status, c.body)
				}
			}
			if len(ids) != 1 {
				t.Errorf("202 answers name %d tasks, want 1: %v", len(ids), ids)
			}
			if rows, all := rowsForKey(t, d.dsn, "acme", "alice", "storm:1", kindImages); rows != 1 {
				t.Errorf("%d task rows, want 1: %v", rows, all)
			}
		})

		t.Run("poll to success: real PNGs, only then", func(t *testing.T) {
			t.Parallel()
			c := newClient(d.b.url)
			task, err := c.GenerateImages(testCtx(t), "poll:1",
				imageclient.ImageRequest{Prompt: "a lighthouse at dawn", AspectRatio: "16:9", N: 2})
			if err != nil {
				t.Fatal(err)
			}
			pngs, err := task.PNGs()
			if err != nil || len(pngs) != 2 {
				t.Fatalf("%d images, %v; want 2", len(pngs), err)
			}
			for i, b := range pngs {
				img, err := png.Decode(bytes.NewReader(b))
				if err != nil {
					t.Fatalf("image %d: %v", i, err)
				}
				if got := img.Bounds().Size(); got.X != 160 || got.Y != 90 {
					t.Errorf("image %d is %v, want 160x90 for 16:9", i, got)
				}
			}
			raw := do(t, http.MethodGet, d.a.url+"/v1/tasks/"+task.ID, alice, "", "").json(t)
			if raw["status"] != "succeeded" || len(raw["images"].([]any)) != 2 {
				t.Errorf("GET after success: %v", raw)
			}
			if _, ok := raw["poll_after_ms"]; ok {
				t.Errorf("finished task still has poll_after_ms: %v", raw)
			}
			if _, ok := raw["error"]; ok {
				t.Errorf("succeeded task has an error: %v", raw)
			}
		})

		t.Run("another user's or tenant's task is 404", func(t *testing.T) {
			t.Parallel()
			first := submit(t, d.a, "private:1", body)
			id, _ := first.json(t)["task_id"].(string)
			got := do(t, http.MethodGet, d.b.url+"/v1/tasks/"+id, alice, "", "")
			if got.status != http.StatusOK {
				t.Fatalf("owner's GET: %d %s", got.status, got.body)
			}
			if view := got.json(t); view["status"] != "succeeded" {
				if _, ok := view["images"]; ok || view["poll_after_ms"] == nil {
					t.Errorf("unfinished task view %v: want poll_after_ms and no images", view)
				}
			}
			for _, tok := range []string{token(t, "acme", "bob"), token(t, "globex", "alice")} {
				for _, path := range []string{"/v1/tasks/" + id, "/v1/tasks/not-a-uuid"} {
					if got := do(t, http.MethodGet, d.b.url+path, tok, "", ""); got.status != http.StatusNotFound ||
						got.json(t)["code"] != "not_found" {
						t.Errorf("GET %s as another caller: %d %s, want 404", path, got.status, got.body)
					}
				}
				if got := do(t, http.MethodPost, d.a.url+"/v1/tasks/"+id+"/recover", tok, "", ""); got.status != http.StatusNotFound {
					t.Errorf("recover as another caller: %d %s, want 404", got.status, got.body)
				}
			}
		})

		t.Run("auth, key and input errors are problems", func(t *testing.T) {
			t.Parallel()
			expired, err := mintToken([]byte(testSecret), "acme", "alice", time.Now().Add(-2*time.Hour), time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			forged, err := mintToken([]byte("not-the-secret"), "acme", "alice", time.Now(), time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			tests := []struct {
				name               string
				givenTok, givenKey string
				whenBody           string
				wantStatus         int
				wantCode           string
			}{
				{name: "no token", givenKey: "k:1", whenBody: body, wantStatus: 401, wantCode: "unauthorized"},
				{name: "forged token", givenTok: forged, givenKey: "k:1", whenBody: body, wantStatus: 401, wantCode: "unauthorized"},
				{name: "expired token", givenTok: expired, givenKey: "k:1", whenBody: body, wantStatus: 401, wantCode: "unauthorized"},
				{name: "no key", givenTok: alice, whenBody: body, wantStatus: 400, wantCode: string(idemgate.CodeKeyMissing)},
				{name: "n out of range", givenTok: alice, givenKey: "bad:n", whenBody: `{"prompt":"x","n":9}`, wantStatus: 400, wantCode: "invalid_request"},
				{name: "no prompt", givenTok: alice, givenKey: "bad:prompt", whenBody: `{"n":1}`, wantStatus: 400, wantCode: "invalid_request"},
				{name: "unknown field", givenTok: alice, givenKey: "bad:field", whenBody: `{"prompt":"x","size":"xl"}`, wantStatus: 400, wantCode: "invalid_request"},
				{name: "bad aspect ratio", givenTok: alice, givenKey: "bad:aspect", whenBody: `{"prompt":"x","aspect_ratio":"2:1"}`, wantStatus: 400, wantCode: "invalid_request"},
			}
			for _, tt := range tests {
				got := do(t, http.MethodPost, d.a.url+"/v1/images", tt.givenTok, tt.givenKey, tt.whenBody)
				if got.status != tt.wantStatus || got.header.Get("Content-Type") != "application/problem+json" ||
					got.json(t)["code"] != tt.wantCode {
					t.Errorf("%s: %d %s %s, want %d problem %s", tt.name, got.status,
						got.header.Get("Content-Type"), got.body, tt.wantStatus, tt.wantCode)
				}
			}
			if got := do(t, http.MethodGet, d.a.url+"/v1/tasks/x", "", "", ""); got.status != http.StatusUnauthorized {
				t.Errorf("GET without token: %d, want 401", got.status)
			}
			if got := do(t, http.MethodGet, d.a.url+"/healthz", "", "", ""); got.status != http.StatusOK {
				t.Errorf("healthz: %d %s", got.status, got.body)
			}
		})

		t.Run("kinds never share keys", func(t *testing.T) {
			t.Parallel()
			img := submit(t, d.a, "shared:1", body)
			mus := do(t, http.MethodPost, d.b.url+"/v1/music", alice, "shared:1", `{"prompt":"a lighthouse at dawn","seconds":1}`)
			if img.status != http.StatusAccepted || mus.status != http.StatusAccepted {
				t.Fatalf("images %d %s, music %d %s; want both 202", img.status, img.body, mus.status, mus.body)
			}
			if img.json(t)["task_id"] == mus.json(t)["task_id"] {
				t.Errorf("one request id under two kinds gave one task")
			}
			if mus.header.Get("Idempotent-Replayed") != "" {
				t.Errorf("music submit was a replay of the image submit")
			}
		})

		t.Run("prompt markers reach every state", func(t *testing.T) {
			t.Parallel()
			tests := []struct {
				name        string
				givenPrompt string
				wantStatus  string
				wantError   string
				wantImages  int
			}{
				{name: "fail", givenPrompt: "a cat #fail", wantStatus: "failed", wantError: "refused"},
				{name: "empty", givenPrompt: "a cat #empty", wantStatus: "failed", wantError: "no result items"},
				{name: "timeout is reconciled on the same task", givenPrompt: "a cat #timeout", wantStatus: "succeeded", wantImages: 2},
				{name: "partial hides its partial image", givenPrompt: "a cat #partial", wantStatus: "failed", wantError: "partial"},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					t.Parallel()
					c := newClient(d.a.url)
					req := imageclient.ImageRequest{Prompt: tt.givenPrompt, N: 2}
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					task, err := c.GenerateImages(ctx, "marker:"+tt.name, req)
					if (err != nil) != (tt.wantStatus == "failed") || (err != nil && !errors.Is(err, imageclient.ErrTaskFailed)) {
						t.Fatalf("GenerateImages: %v", err)
					}
					if task.Status != tt.wantStatus || !strings.Contains(task.Error, tt.wantError) || len(task.Images) != tt.wantImages {
						t.Fatalf("task = %s %q with %d images; want %s %q with %d",
							task.Status, task.Error, len(task.Images), tt.wantStatus, tt.wantError, tt.wantImages)
					}
				})
			}
		})

		t.Run("a failed task with partial results recovers on the same task", func(t *testing.T) {
			t.Parallel()
			c := newClient(d.b.url)
			task, err := c.GenerateImages(testCtx(t), "recover:1", imageclient.ImageRequest{Prompt: "a dog #partial", N: 3})
			if !errors.Is(err, imageclient.ErrTaskFailed) {
				t.Fatalf("first run: %+v %v; want failed", task, err)
			}
			rec := do(t, http.MethodPost, d.a.url+"/v1/tasks/"+task.ID+"/recover", alice, "", "")
			if rec.status != http.StatusAccepted || rec.json(t)["task_id"] != task.ID {
				t.Fatalf("recover: %d %s", rec.status, rec.body)
			}
			done, err := c.Wait(testCtx(t), task.ID, 0)
			if err != nil || len(done.Images) != 3 {
				t.Fatalf("after recover: %+v %v; want 3 images", done.Status, err)
			}
			again := do(t, http.MethodPost, d.a.url+"/v1/tasks/"+task.ID+"/recover", alice, "", "")
			if again.status != http.StatusConflict || again.json(t)["code"] != "not_recoverable" {
				t.Errorf("recovering a succeeded task: %d %s, want 409 not_recoverable", again.status, again.body)
			}
		})

		t.Run("demo tells the story against a running node", func(t *testing.T) {
			t.Parallel()
			out := t.TempDir()
			cmd := exec.Command(proctest.Build(t, examplePkg), "demo", "-url", d.b.url, "-out", out)
			cmd.Env = append(os.Environ(), "JWT_SECRET="+testSecret)
			story, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("demo: %v\n%s", err, story)
			}
			for _, want := range []string{"202 Accepted", "the SAME task; Idempotent-Replayed: true", "409 Conflict, code " + string(idemgate.CodeKeyReused),
				"a new task", "→ succeeded"} {
				if !bytes.Contains(story, []byte(want)) {
					t.Errorf("demo output lacks %q:\n%s", want, story)
				}
			}
			files, _ := filepath.Glob(filepath.Join(out, "*.png"))
			if len(files) != 2 {
				t.Errorf("demo wrote %d PNGs, want 2", len(files))
			}
		})

		t.Run("a retrying client through a proxy that loses the first answer", func(t *testing.T) {
			t.Parallel()
			proxy := &lossyProxy{target: d.a.url}
			srv := httptest.NewServer(proxy)
			t.Cleanup(srv.Close)
			c := newClient(srv.URL)
			req := imageclient.ImageRequest{Prompt: "a lighthouse in fog", AspectRatio: "1:1", N: 1}
			id := imageclient.RequestID("lossy", req)

			task, err := c.GenerateImages(testCtx(t), id, req)

			if err != nil {
				t.Fatal(err)
			}
			proxy.mu.Lock()
			lost, submits := proxy.lost, proxy.submits
			proxy.mu.Unlock()
			var lostAnswer struct {
				TaskID string `json:"task_id"`
			}
			if err := json.Unmarshal(lost, &lostAnswer); err != nil || submits != 2 {
				t.Fatalf("proxy lost %q after %d submits; want a lost 202 and a retry", lost, submits)
			}
			if task.ID != lostAnswer.TaskID || len(task.Images) != 1 {
				t.Errorf("client ended with task %s (%d images); the lost answer named %s", task.ID, len(task.Images), lostAnswer.TaskID)
			}
			if n, ids := rowsForKey(t, d.dsn, "acme", "alice", id, kindImages); n != 1 {
				t.Errorf("%d task rows, want exactly 1: %v", n, ids)
			}
		})
	})
}

// lossyProxy forwards to target, but for the first POST /v1/images it
// reads the server's whole answer — the server has done its work — and
// then drops the client's connection: the seed's timeout.
type lossyProxy struct {
	target  string
	mu      sync.Mutex
	submits int
	lost    []byte
}

func (p *lossyProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	out, err := http.NewRequestWithContext(r.Context(), r.Method, p.target+r.URL.RequestURI(), r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	resp, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if r.Method == http.MethodPost && r.URL.Path == "/v1/images" {
		p.mu.Lock()
		p.submits++
		drop := p.lost == nil
		if drop {
			p.lost = body
		}
		p.mu.Unlock()
		if drop {
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
			return
		}
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(body)
}

var (
	pgDirRE = regexp.MustCompile(`throwaway cluster on \S+ in (\S+),`)
	tokenRE = regexp.MustCompile(`TOKEN=(\S+)`)
	ctrlCRE = regexp.MustCompile(`Ctrl-C stops it\.`)
)

// TestEmbeddedDefaults runs the binary with nothing configured: it starts
// its own Postgres and miniredis, serves, and on SIGINT exits cleanly and
// removes its throwaway cluster.
func TestEmbeddedDefaults(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds the binary and starts a PostgreSQL cluster")
	}
	t.Parallel()
	p := startProc(t, nil, "-addr", "127.0.0.1:0", "-gen-time", "200ms")
	if _, err := p.WaitOutput(ctrlCRE, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	out := p.Output()
	dir, tok := pgDirRE.FindStringSubmatch(out), tokenRE.FindStringSubmatch(out)
	if dir == nil || tok == nil || !strings.Contains(out, "WARNING: JWT_SECRET is not set") ||
		!strings.Contains(out, "in-process miniredis") || !strings.Contains(out, "curl ") {
		t.Fatalf("startup lines lack the cluster dir, token, warning, redis or curl:\n%s", out)
	}
	if _, err := os.Stat(dir[1]); err != nil {
		t.Fatalf("throwaway cluster dir: %v", err)
	}

	c := imageclient.New(imageclient.Config{BaseURL: p.url, Token: tok[1]})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	task, err := c.GenerateImages(ctx, "embedded:1", imageclient.ImageRequest{Prompt: "hello", N: 1})
	if err != nil || len(task.Images) != 1 {
		t.Fatalf("GenerateImages: %+v %v", task.Status, err)
	}

	start := time.Now()
	if err := p.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	// shutdownBudget bounds the server and workers; stopping and removing
	// the throwaway cluster comes after, so allow twice that on a loaded
	// machine.
	if err := p.Wait(2 * shutdownBudget); err != nil {
		t.Fatalf("after SIGINT: %v\n%s", err, p.Output())
	}
	t.Logf("exited %v after SIGINT", time.Since(start).Round(time.Millisecond))
	if _, err := os.Stat(dir[1]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("throwaway cluster dir %s still there after exit (stat: %v)", dir[1], err)
	}
}

// testCtx bounds a client call so that a stuck task fails the test
// instead of hanging the suite.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}
