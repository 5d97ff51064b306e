package middleware_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestSlowUploadIsRetryable: a body that does not arrive before the
// server's read deadline (http.Server.ReadTimeout: a slow upload, a
// stalled link) is answered 408 body_timeout, x-should-retry: true with
// Retry-After, not a final 400 body_invalid: the same request sent in
// time succeeds.
func TestSlowUploadIsRetryable(t *testing.T) {
	t.Parallel()
	v := newEnv(t, nil, nil)
	srv := httptest.NewUnstartedServer(v.e)
	srv.Config.ReadTimeout = 500 * time.Millisecond
	srv.Start()
	t.Cleanup(srv.Close)

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Patience, not a timing assertion: the answer comes once the
	// server's deadline passes.
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	head := "POST /v1/images HTTP/1.1\r\nHost: example.com\r\nIdempotency-Key: slow\r\nX-Tenant: acme\r\nX-User: alice\r\n" +
		"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
	if _, err := io.WriteString(conn, head+`{"prompt":`); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), `"code":"body_timeout"`) {
		t.Errorf("slow upload = %d %s, want 408 body_timeout", res.StatusCode, body)
	}
	if res.Header.Get("X-Should-Retry") != "true" || res.Header.Get("Retry-After") == "" {
		t.Errorf("slow upload hint: x-should-retry %q, Retry-After %q; want true with a Retry-After",
			res.Header.Get("X-Should-Retry"), res.Header.Get("Retry-After"))
	}
	if v.calls.Load() != 0 {
		t.Errorf("the handler ran %d times on a body that never arrived", v.calls.Load())
	}

	r, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/images", strings.NewReader(imageBody))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Idempotency-Key", "slow")
	r.Header.Set("X-Tenant", "acme")
	r.Header.Set("X-User", "alice")
	r.Header.Set("Content-Type", "application/json")
	retry, err := srv.Client().Do(r)
	if err != nil {
		t.Fatal(err)
	}
	retry.Body.Close()
	if retry.StatusCode != http.StatusCreated {
		t.Errorf("the retry in time = %d, want 201", retry.StatusCode)
	}
}
