package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemgate/idemgate/internal/testenv"
)

// Attack: markup in everything the page shows back — the user and tenant
// (the "signed in as" line and the wire log), the prompt and action (the
// request log, the replayed body), and the 409's problem document after
// a reword. Nothing of it may become markup: no element from the payload
// appears, no script runs.
func TestAttackPageXSS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node and a browser")
	}
	ctx := browser(t)
	s := settings{addr: "127.0.0.1:0", databaseURL: testenv.PostgresDSN(t), workers: 1, genTime: 100 * time.Millisecond}
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

// Attack: a node with a real JWT_SECRET must not mint tokens at
// /dev/token (with the dev secret it may), and /metrics is never on the
// API listener.
func TestAttackDevTokenWithRealSecret(t *testing.T) {
	for _, secret := range []string{"", "a-real-secret-of-enough-length-0123456789"} {
		s := settings{addr: "127.0.0.1:0", databaseURL: testenv.PostgresDSN(t), workers: 1, jwtSecret: secret}
		n, err := startNode(context.Background(), s, slog.New(slog.DiscardHandler), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.Post(n.url()+"/dev/token", "application/json", strings.NewReader(`{"tenant":"acme","user":"mallory"}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := http.StatusOK
		if secret != "" {
			want = http.StatusNotFound
		}
		if resp.StatusCode != want || (secret != "" && strings.Contains(string(body), "token")) {
			t.Errorf("JWT_SECRET %q: /dev/token answered %d %s, want %d", secret, resp.StatusCode, body, want)
		}
		resp, err = http.Get(n.url() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), "idemgate_") {
			t.Errorf("the API listener serves metrics: %d %.200s", resp.StatusCode, body)
		}
		_ = n.shutdown()
	}
}

// Attack: the default admin address must bind loopback only.
func TestAttackAdminDefaultLoopback(t *testing.T) {
	o, err := newObserver(context.Background(), obsSettings{}, "serve")
	if err != nil {
		t.Fatal(err)
	}
	defer o.shutdown(context.Background())
	host, _, err := net.SplitHostPort(defaultAdminAddr)
	if err != nil {
		t.Fatal(err)
	}
	a, err := startAdmin(obsSettings{adminAddr: net.JoinHostPort(host, "0"), adminExplicit: true}, o, io.Discard)
	if err != nil || a == nil {
		t.Fatalf("admin on %s: %v", host, err)
	}
	defer a.close(context.Background())
	if ip := a.ln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
		t.Errorf("default admin host %q listens on %v, want loopback", host, ip)
	}
}
