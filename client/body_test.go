package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestSendResendsAReadersBytesOnRetry: a reader is read once and its bytes
// go out on every attempt, never a JSON encoding of the reader ({}).
func TestSendResendsAReadersBytesOnRetry(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, answer{drop: true}, answer{status: 201})
	var waits []time.Duration
	c := newTestClient(Config{BaseURL: srv.URL, Sleep: recordSleeps(&waits)})
	const body = `{"amount":10,"currency":"EUR"}`

	r, err := c.Send(context.Background(), http.MethodPost, "/v1/payments", "k", strings.NewReader(body))
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	_, _, bodies, _ := srv.seen()
	if len(bodies) != 2 || bodies[0] != body || bodies[1] != body || r.Attempts != 2 {
		t.Fatalf("the server saw bodies %q (attempts %d), want %q twice", bodies, r.Attempts, body)
	}
}

// TestSendRefusesAReaderOverTheLimit: a reader longer than the limit is
// refused before anything is sent: a cut body would be another request.
func TestSendRefusesAReaderOverTheLimit(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, answer{status: 201})
	c := New(Config{BaseURL: srv.URL})
	c.maxRequestBody = 1 << 20 // 64 MiB in use; 1 MiB keeps the test light
	big := io.LimitReader(zeros{}, 1<<20+1)

	_, err := c.Send(context.Background(), http.MethodPost, "/v1/uploads", "k", big)
	if err == nil || !strings.Contains(err.Error(), "over 1 MiB") {
		t.Fatalf("Send = %v, want a refusal of the body over 1 MiB", err)
	}
	if keys, _, _, _ := srv.seen(); len(keys) != 0 {
		t.Errorf("the server saw %d requests, want none", len(keys))
	}
}

// TestSendTakesAReaderOfExactlyTheLimit: the limit is inclusive.
func TestSendTakesAReaderOfExactlyTheLimit(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, answer{status: 201})
	c := New(Config{BaseURL: srv.URL})
	c.maxRequestBody = 1 << 20
	if _, err := c.Send(context.Background(), http.MethodPost, "/v1/uploads", "k", io.LimitReader(zeros{}, 1<<20)); err != nil {
		t.Fatalf("Send: %v", err)
	}
	if _, _, bodies, _ := srv.seen(); len(bodies) != 1 || len(bodies[0]) != 1<<20 {
		t.Errorf("the server saw %d requests, want one of 1 MiB", len(bodies))
	}
}

// TestSendReportsAReadersError: a reader that fails is the caller's error,
// not a body cut short and sent.
func TestSendReportsAReadersError(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t)
	c := New(Config{BaseURL: srv.URL})
	_, err := c.Send(context.Background(), http.MethodPost, "/v1/uploads", "k", io.MultiReader(strings.NewReader("{"), failingReader{}))
	if err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("Send = %v, want the reader's error", err)
	}
	if keys, _, _, _ := srv.seen(); len(keys) != 0 {
		t.Errorf("the server saw %d requests, want none", len(keys))
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errDiskOnFire }

var errDiskOnFire = errors.New("disk on fire")

// TestSendStopsReadingABodyWithTheContext: a reader that never ends (a
// pipe whose writer hangs) does not hold Send past its context, as
// net/http does not hold a request whose body hangs; nothing is sent.
func TestSendStopsReadingABodyWithTheContext(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t)
	c := New(Config{BaseURL: srv.URL})
	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		pw.Write([]byte(`{"amount":`)) // then the writer hangs
		cancel()
	}()

	done := make(chan error, 1)
	go func() {
		_, err := c.Send(ctx, http.MethodPost, "/v1/uploads", "k", pr)
		done <- err
	}()

	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Send = %v, want an error matching context.Canceled", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Send still reading its body a minute after its context was cancelled")
	}
	if keys, _, _, _ := srv.seen(); len(keys) != 0 {
		t.Errorf("the server saw %d requests, want none", len(keys))
	}
}

// TestSendResendsAFilesBytesOnRetry: an *os.File is a reader like any
// other: read once, its bytes sent on every attempt with
// Content-Type: application/json, and the file left open for the caller.
func TestSendResendsAFilesBytesOnRetry(t *testing.T) {
	t.Parallel()
	const body = `{"amount":10}`
	path := filepath.Join(t.TempDir(), "payment.json")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	srv := newFakeServer(t, answer{drop: true}, problem(503, "store_unavailable", ""), answer{status: 201})
	c := newTestClient(Config{BaseURL: srv.URL, Sleep: recordSleeps(new([]time.Duration))})

	if _, err := c.Send(context.Background(), http.MethodPost, "/v1/payments", "k", f); err != nil {
		t.Fatalf("Send: %v", err)
	}
	keys, _, bodies, _ := srv.seen()
	if want := []string{body, body, body}; !slices.Equal(bodies, want) || !slices.Equal(keys, []string{"k", "k", "k"}) ||
		!slices.Equal(srv.contentTypes(), []string{"application/json", "application/json", "application/json"}) {
		t.Errorf("the server saw bodies %q, keys %q, Content-Types %q; want %q under k with application/json", bodies, keys, srv.contentTypes(), want)
	}
	if _, err := f.Stat(); err != nil {
		t.Errorf("the file after Send: %v, want it open", err)
	}
}

// TestSendRefusesAReaderPassedByValue: a bytes.Buffer (or strings.Reader,
// bytes.Reader) passed by value is no io.Reader, only its pointer is; it
// is refused before anything is sent, never JSON-encoded as {} and
// "succeeding".
func TestSendRefusesAReaderPassedByValue(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	buf.WriteString(`{"amount":10}`)
	for _, given := range []any{buf, *strings.NewReader(`{"amount":10}`), *bytes.NewReader([]byte(`{"amount":10}`))} {
		srv := newFakeServer(t, answer{status: 201})
		c := New(Config{BaseURL: srv.URL})
		_, err := c.Send(context.Background(), http.MethodPost, "/v1/payments", "k", given)
		_, _, bodies, _ := srv.seen()
		if err == nil || len(bodies) != 0 {
			t.Errorf("Send(%T) = %v and the server saw %q, want a refusal and nothing sent", given, err, bodies)
		}
	}
}

// TestSendSendsARawMessageAsItIs: a json.RawMessage is bytes the caller
// already encoded, sent as they are like a []byte, not re-encoded
// (compacted, "<" escaped) by encoding/json.
func TestSendSendsARawMessageAsItIs(t *testing.T) {
	t.Parallel()
	const body = `{"note": "<b>paid</b> & done"}`
	srv := newFakeServer(t, answer{status: 201})
	c := New(Config{BaseURL: srv.URL})
	if _, err := c.Send(context.Background(), http.MethodPost, "/v1/payments", "k", json.RawMessage(body)); err != nil {
		t.Fatal(err)
	}
	if _, _, bodies, _ := srv.seen(); !slices.Equal(bodies, []string{body}) || !slices.Equal(srv.contentTypes(), []string{"application/json"}) {
		t.Errorf("the server saw %q (Content-Type %q), want %q as application/json", bodies, srv.contentTypes(), body)
	}
}

// TestSendPanicsInTheCallersGoroutineOnAPanickingReader: a reader whose
// Read panics (a nil *bytes.Buffer) panics in the goroutine that called
// Send, where the caller's recover can catch it, not in one of the
// client's own that would end the program.
func TestSendPanicsInTheCallersGoroutineOnAPanickingReader(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t)
	c := New(Config{BaseURL: srv.URL})
	var nilBuffer *bytes.Buffer
	recovered := func() (r any) {
		defer func() { r = recover() }()
		c.Send(context.Background(), http.MethodPost, "/v1/payments", "k", nilBuffer)
		return nil
	}()
	if recovered == nil {
		t.Errorf("Send with a nil *bytes.Buffer did not panic")
	}
	if keys, _, _, _ := srv.seen(); len(keys) != 0 {
		t.Errorf("the server saw %d requests, want none", len(keys))
	}
}
