package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/pgstore"
)

// screenshotEnv names a path where TestPage writes its screenshot (PNG),
// e.g. IDEMGATE_PAGE_SCREENSHOT=$PWD/docs/page.png for the README.
const screenshotEnv = "IDEMGATE_PAGE_SCREENSHOT"

// chromium returns the path of a Chromium (Debian package chromium). In CI
// its absence fails the test: .ci/run installs it.
func chromium(t *testing.T) string {
	t.Helper()
	// Debian's /usr/bin/chromium is a wrapper script; the binary is here.
	for _, p := range []string{os.Getenv("CHROMIUM"), "/usr/lib/chromium/chromium"} {
		if p != "" {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no Chromium: install the Debian package chromium (.ci/run does)")
	}
	t.Skip("no Chromium (apt-get install chromium)")
	return ""
}

// browser starts a headless Chromium with a fresh profile and returns a
// context for its first tab.
func browser(t *testing.T) context.Context {
	t.Helper()
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromium(t)),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true), // root in CI
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 860),
	)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	// The first Run starts the browser; it lives as long as ctx.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// waitFor polls a JavaScript condition on the page, failing the test with
// what the page shows when it does not become true.
func waitFor(t *testing.T, ctx context.Context, what, expr string) {
	t.Helper()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(45*time.Second))); err != nil {
		status, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("status").innerText + " | " +
			document.getElementById("problem").innerText + " | " + document.getElementById("log").innerText`))
		t.Fatalf("%s: %v\npage: %s", what, err, status)
	}
}

func text(t *testing.T, ctx context.Context, expr string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	return s
}

// TestPage drives the page in a real headless Chromium against a real
// node (Postgres, miniredis, workers): sign in, generate → images shown,
// retry the same → replayed badge and the same task, reword under the same
// key → the 409 problem's title and detail.
func TestPage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node and a browser")
	}
	ctx := browser(t)

	s := settings{addr: "127.0.0.1:0", databaseURL: testenv.PostgresDSN(t), workers: 1, genTime: 200 * time.Millisecond, dev: true}
	n, err := startNode(context.Background(), s, slog.New(slog.DiscardHandler), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.shutdown() })

	click := func(id string) {
		t.Helper()
		if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID(id), chromedp.NodeVisible)); err != nil {
			t.Fatalf("click %s: %v", id, err)
		}
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(n.url()+"/"), chromedp.WaitVisible(chromedp.ID("generate-btn"))); err != nil {
		t.Fatal(err)
	}

	click("signin-btn")
	waitFor(t, ctx, "sign in", `document.getElementById("who").textContent.includes("signed in as alice")`)

	// Generate: 202, polling, then the PNGs.
	click("generate-btn")
	waitFor(t, ctx, "images shown", `(() => {
		const imgs = [...document.querySelectorAll("#gallery img")];
		return imgs.length === 2 && imgs.every(i => i.complete && i.naturalWidth > 0);
	})()`)
	if got := text(t, ctx, `document.getElementById("status").innerText`); !strings.Contains(got, "202") || !strings.Contains(got, "succeeded") {
		t.Errorf("status after generate = %q, want the 202 and succeeded", got)
	}
	if got := text(t, ctx, `document.getElementById("log").innerText`); !strings.Contains(got, "Idempotency-Key: poster:launch-1:generate") ||
		!strings.Contains(got, "GET /v1/tasks/") {
		t.Errorf("wire log lacks the key or the polling:\n%s", got)
	}
	task := text(t, ctx, `document.getElementById("status").innerText.match(/task (\S+)/)[1]`)

	// Retry the same: replayed, the same task.
	click("retry-btn")
	waitFor(t, ctx, "replayed badge", `document.querySelector("#status .badge.replayed") !== null`)
	if got := text(t, ctx, `document.getElementById("status").innerText.match(/task (\S+)/)[1]`); got != task {
		t.Errorf("retry shows task %s, want the same task %s", got, task)
	}
	if got := text(t, ctx, `document.getElementById("log").innerText`); !strings.Contains(got, "Idempotent-Replayed: true") {
		t.Errorf("wire log lacks Idempotent-Replayed:\n%s", got)
	}

	// Reword under the same key: the server refuses, the page says why.
	click("reword-btn")
	waitFor(t, ctx, "conflict shown", `!document.getElementById("problem").hidden &&
		document.getElementById("status").innerText.includes("409")`)
	title := text(t, ctx, `document.querySelector("#problem .title").innerText`)
	detail := text(t, ctx, `document.querySelector("#problem .detail").innerText`)
	code := text(t, ctx, `(document.querySelector("#problem .code") || {innerText: ""}).innerText`)
	if !strings.Contains(title, "409") || detail == "" || code != "code: "+string(idemgate.CodeKeyReused) {
		t.Errorf("conflict shown as title %q detail %q %q; want the problem's title (409), detail and code key_reused", title, detail, code)
	}
	// The server names the changed fields (problem member "changed": the
	// route has fingerprint fields); the page shows them.
	if got := text(t, ctx, `document.querySelector("#log li:last-child").innerText`); !strings.Contains(got, `"changed":["/prompt"]`) {
		t.Errorf("the 409 does not name /prompt as changed:\n%s", got)
	}
	if got := text(t, ctx, `(document.querySelector("#problem .changed") || {innerText: ""}).innerText`); !strings.Contains(got, "/prompt") {
		t.Errorf("the page shows changed %q, want /prompt", got)
	}
	if got := text(t, ctx, `document.getElementById("prompt").value`); !strings.Contains(got, "dusk") {
		t.Errorf("reworded prompt %q", got)
	}
	if got := text(t, ctx, `[...document.querySelectorAll(".rules li.met")].map(l => l.id).join(",")`); got != "rule1,rule2,rule3" {
		t.Errorf("rules shown as met: %q, want all three", got)
	}

	// The queue card shows each kind's running count against its limit,
	// and a kind an operator paused.
	if err := n.b.store.SetKindLimits(context.Background(), kindImages, pgstore.KindLimits{MaxRunning: 8, Paused: true}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "queue shows images paused with its limit", `(() => {
		const r = document.querySelector('#queue tr[data-kind="images"]');
		return r !== null && r.innerText.includes("paused") && r.innerText.includes("/ 8");
	})()`)
	if got := text(t, ctx, `document.querySelector('#queue tr[data-kind="music"]').innerText`); strings.Contains(got, "paused") {
		t.Errorf("music shown as %q: only images was paused", got)
	}

	if path := os.Getenv(screenshotEnv); path != "" {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
	}
}

// TestDevToken checks that the page's sign-in endpoint exists only with the
// public dev secret, and that its tokens pass the API's auth.
func TestDevToken(t *testing.T) {
	for _, dev := range []bool{true, false} {
		e := echo.New()
		e.HTTPErrorHandler = errorHandler(slog.New(slog.DiscardHandler))
		secret := []byte(devSecret)
		withPage(e, nil, secret, dev)
		e.GET("/whoami", func(c echo.Context) error {
			tenant, user, err := identity(c)
			if err != nil {
				return err
			}
			return c.String(http.StatusOK, tenant+"/"+user)
		}, authMiddleware(secret))

		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/dev/token", strings.NewReader(`{"tenant":"acme","user":"bob"}`))
		req.Header.Set("Content-Type", "application/json")
		e.ServeHTTP(rec, req)
		if !dev {
			if rec.Code != http.StatusNotFound {
				t.Errorf("with a real secret: /dev/token answered %d, want 404", rec.Code)
			}
			continue
		}
		if rec.Code != http.StatusOK {
			t.Fatalf("/dev/token: %d %s", rec.Code, rec.Body)
		}
		tok := strings.Split(strings.Split(rec.Body.String(), `"token":"`)[1], `"`)[0]
		rec = httptest.NewRecorder()
		req = httptest.NewRequest(http.MethodGet, "/whoami", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		e.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK || rec.Body.String() != "acme/bob" {
			t.Errorf("minted token: %d %q, want 200 acme/bob", rec.Code, rec.Body)
		}

		for _, body := range []string{`{"tenant":"","user":"bob"}`, `{"tenant":"acme"}`, `{"tenant":"acme","user":"bob","admin":true}`} {
			rec = httptest.NewRecorder()
			req = httptest.NewRequest(http.MethodPost, "/dev/token", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			e.ServeHTTP(rec, req)
			if rec.Code != http.StatusBadRequest {
				t.Errorf("/dev/token %s: %d, want 400", body, rec.Code)
			}
		}
	}
}

// TestPageAssets checks that GET / and the assets it names are served.
func TestPageAssets(t *testing.T) {
	e := echo.New()
	registerPage(e, nil)
	get := func(path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec
	}
	index := get("/")
	if index.Code != http.StatusOK || !strings.Contains(index.Body.String(), `id="generate-btn"`) {
		t.Fatalf("GET /: %d", index.Code)
	}
	for _, asset := range []string{"/web/app.js", "/web/style.css"} {
		if !strings.Contains(index.Body.String(), `"`+asset+`"`) {
			t.Errorf("index.html does not name %s", asset)
		}
		if rec := get(asset); rec.Code != http.StatusOK || rec.Body.Len() == 0 {
			t.Errorf("GET %s: %d", asset, rec.Code)
		}
	}
	if rec := get("/web/nope.js"); rec.Code != http.StatusNotFound {
		t.Errorf("GET /web/nope.js: %d, want 404", rec.Code)
	}
}

// TestPageButtons drives the page against a scripted stand-in of the API,
// for what the real one may not answer yet: the 409's "changed" member and
// the cancel route. It checks what the page renders, not the server.
func TestPageButtons(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	ctx := browser(t)
	e := echo.New()
	registerPage(e, []byte(devSecret))
	var submits int
	e.POST("/v1/images", func(c echo.Context) error {
		submits++
		if submits == 1 {
			return c.JSON(http.StatusAccepted, map[string]any{"task_id": "t-1", "status": "pending", "poll_after_ms": 60000})
		}
		return c.JSONBlob(http.StatusConflict, []byte(`{"type":"https://github.com/idemgate/idemgate#key_reused",`+
			`"title":"Idempotency key reused","status":409,"detail":"other parameters","code":"key_reused","changed":["/prompt"]}`))
	})
	e.POST("/v1/tasks/:id/cancel", func(c echo.Context) error {
		return c.JSON(http.StatusOK, map[string]any{"task_id": c.Param("id"), "status": "cancelled", "error": "cancelled by the owner"})
	})
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)

	click := func(id string) {
		t.Helper()
		if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID(id), chromedp.NodeVisible)); err != nil {
			t.Fatalf("click %s: %v", id, err)
		}
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.ID("generate-btn"))); err != nil {
		t.Fatal(err)
	}
	click("signin-btn")
	waitFor(t, ctx, "sign in", `document.getElementById("who").textContent.includes("signed in")`)
	click("generate-btn")
	waitFor(t, ctx, "202 shown", `document.getElementById("status").innerText.includes("t-1")`)

	click("reword-btn")
	waitFor(t, ctx, "changed shown", `(document.querySelector("#problem .changed") || {innerText: ""}).innerText.includes("/prompt")`)
	if got := text(t, ctx, `document.querySelector("#problem .detail").innerText`); got != "other parameters" {
		t.Errorf("detail %q", got)
	}

	click("cancel-btn")
	waitFor(t, ctx, "cancelled shown", `document.getElementById("status").innerText.includes("cancelled")`)
	if got := text(t, ctx, `document.querySelector("#problem .title").innerText`); !strings.Contains(got, "cancelled") {
		t.Errorf("after cancel the page shows %q, want the task's end", got)
	}
}

// Markup in everything the page shows back — the user and tenant
// (the "signed in as" line and the wire log), the prompt and action (the
// request log, the replayed body), and the 409's problem document after
// a reword. Nothing of it may become markup: no element from the payload
// appears, no script runs.
func TestPageRendersUserTextAsText(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node and a browser")
	}
	ctx := browser(t)
	s := settings{addr: "127.0.0.1:0", databaseURL: testenv.PostgresDSN(t), workers: 1, genTime: 100 * time.Millisecond, dev: true}
	n, err := startNode(context.Background(), s, slog.New(slog.DiscardHandler), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.shutdown() })

	const payload = `<img id="pwned" src=x onerror="window.__xss=1"><script>window.__xss=2</script>`
	do := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	do("open", chromedp.Navigate(n.url()+"/"), chromedp.WaitVisible(chromedp.ID("generate-btn")))
	do("fill sign-in", chromedp.SetValue(chromedp.ID("tenant"), "acme"+payload),
		chromedp.SetValue(chromedp.ID("user"), "eve"+payload),
		chromedp.Click(chromedp.ID("signin-btn"), chromedp.NodeVisible))
	waitFor(t, ctx, "sign in", `document.getElementById("who").textContent.includes("signed in as eve")`)
	do("fill prompt", chromedp.SetValue(chromedp.ID("prompt"), "a cat "+payload),
		chromedp.Click(chromedp.ID("generate-btn"), chromedp.NodeVisible))
	waitFor(t, ctx, "202", `document.getElementById("status").innerText.includes("202")`)
	do("reword", chromedp.Click(chromedp.ID("reword-btn"), chromedp.NodeVisible))
	waitFor(t, ctx, "conflict shown", `!document.getElementById("problem").hidden`)

	if got := text(t, ctx, `document.getElementById("log").innerText`); !strings.Contains(got, "<script>") {
		t.Errorf("the wire log does not show the payload as text:\n%s", got)
	}
	if got := text(t, ctx, `String(window.__xss) + " " + document.querySelectorAll("#pwned, script:not([src])").length`); got != "undefined 0" {
		t.Errorf("payload became markup: window.__xss and injected elements = %q", got)
	}
}
