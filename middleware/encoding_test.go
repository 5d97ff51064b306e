package middleware_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	echomw "github.com/labstack/echo/v4/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/redisstore"
)

// encodingEnv is an echo with the middleware outermost and echo's Gzip
// inside it (e.Use(idem); e.Use(Gzip)): what the middleware captures and
// stores is the compressed body. The handler answers body, or, when
// encoding is set, those bytes under that Content-Encoding itself.
func encodingEnv(t *testing.T, body []byte, encoding string, configure func(*middleware.Config)) *env {
	t.Helper()
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	v := &env{e: echo.New(), mr: mr, client: client, store: redisstore.New(client), events: &recorder{}}
	cfg := middleware.Config{Store: v.store, Scope: testScope, OnEvent: v.events.add}
	if configure != nil {
		configure(&cfg)
	}
	v.e.Use(middleware.New(cfg))
	// A handler that encodes its own answer is not compressed again.
	v.e.Use(echomw.GzipWithConfig(echomw.GzipConfig{Skipper: func(echo.Context) bool { return encoding != "" }}))
	v.e.POST("/v1/report", func(c echo.Context) error {
		v.calls.Add(1)
		if encoding != "" {
			c.Response().Header().Set("Content-Encoding", encoding)
		}
		return c.Blob(http.StatusCreated, "application/json", body)
	})
	return v
}

func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	r, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not gzip: %v", err)
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("bad gzip: %v", err)
	}
	return out
}

func (v *env) send(path, acceptEncoding string) *httptest.ResponseRecorder {
	r := req{path: path, key: "k", body: imageBody}.build()
	if acceptEncoding != "" {
		r.Header.Set("Accept-Encoding", acceptEncoding)
	}
	rec := httptest.NewRecorder()
	v.e.ServeHTTP(rec, r)
	return rec
}

// TestReplayEncoding: a replay never sends a Content-Encoding the retry
// did not accept. A stored gzip body is decoded for a retry that does not
// accept gzip (when the decoded body fits MaxResponseBytes); a coding the
// middleware cannot decode, or a body too large decoded, is refused with
// 406 encoding_not_acceptable. A retry that accepts the stored coding gets
// the stored bytes.
func TestReplayEncoding(t *testing.T) {
	t.Parallel()
	report := []byte(`{"report":"` + strings.Repeat("all quiet; ", 200) + `"}`)
	tests := []struct {
		name       string
		body       []byte // what the handler writes
		encoding   string // Content-Encoding the handler sets itself
		maxResp    int64
		firstAE    string // Accept-Encoding of the first request
		retryAE    string // Accept-Encoding of the retry
		wantStatus int
		wantCE     string // Content-Encoding of the retry's answer
		wantBody   []byte // the retry's body after removing wantCE; nil: not checked
	}{
		{name: "gzip stored, retry without Accept-Encoding gets it decoded",
			body: report, firstAE: "gzip", retryAE: "", wantStatus: 201, wantBody: report},
		{name: "gzip stored, retry refusing gzip gets it decoded",
			body: report, firstAE: "gzip", retryAE: "gzip;q=0, identity", wantStatus: 201, wantBody: report},
		{name: "gzip stored, retry accepting gzip gets the stored bytes",
			body: report, firstAE: "gzip", retryAE: "deflate, GZIP;q=0.5", wantStatus: 201, wantCE: "gzip", wantBody: report},
		{name: "gzip stored, retry accepting any coding gets the stored bytes",
			body: report, firstAE: "gzip", retryAE: "*", wantStatus: 201, wantCE: "gzip", wantBody: report},
		{name: "identity stored, retry accepting gzip gets identity",
			body: report, firstAE: "", retryAE: "gzip", wantStatus: 201, wantBody: report},
		{name: "gzip too large decoded is refused",
			body: bytes.Repeat([]byte{' '}, 64<<10), maxResp: 32 << 10, firstAE: "gzip", retryAE: "",
			wantStatus: 406},
		{name: "coding the middleware cannot decode is refused",
			body: []byte("not really brotli"), encoding: "br", firstAE: "br", retryAE: "gzip", wantStatus: 406},
		{name: "coding accepted by a wildcard is replayed",
			body: []byte("not really brotli"), encoding: "br", firstAE: "br", retryAE: "gzip, *;q=0.1",
			wantStatus: 201, wantCE: "br", wantBody: []byte("not really brotli")},
		{name: "coding excluded despite a wildcard is refused",
			body: []byte("not really brotli"), encoding: "br", firstAE: "br", retryAE: "br;q=0, *",
			wantStatus: 406},
		{name: "gzip stored, no response limit, retry without Accept-Encoding gets it decoded",
			body: report, maxResp: math.MaxInt64, firstAE: "gzip", retryAE: "", wantStatus: 201, wantBody: report},
		{name: "corrupt gzip is refused",
			body: []byte("not gzip at all"), encoding: "gzip", firstAE: "gzip", retryAE: "", wantStatus: 406},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := encodingEnv(t, tt.body, tt.encoding, func(c *middleware.Config) { c.MaxResponseBytes = tt.maxResp })
			first := v.send("/v1/report", tt.firstAE)
			if first.Code != 201 {
				t.Fatalf("first request = %d %s", first.Code, first.Body)
			}
			rec := v.send("/v1/report", tt.retryAE)
			if v.calls.Load() != 1 {
				t.Errorf("handler ran %d times, want 1", v.calls.Load())
			}
			if rec.Code != tt.wantStatus {
				t.Fatalf("retry = %d %q, want %d", rec.Code, rec.Body, tt.wantStatus)
			}
			if tt.wantStatus == 406 {
				if got := problemCode(t, rec); got != "encoding_not_acceptable" {
					t.Errorf("problem code = %q, want encoding_not_acceptable", got)
				}
				if rec.Header().Get("Content-Encoding") != "" {
					t.Errorf("refusal has Content-Encoding %q", rec.Header().Get("Content-Encoding"))
				}
				return
			}
			if rec.Header().Get("Idempotent-Replayed") != "true" {
				t.Errorf("retry not replayed")
			}
			if got := rec.Header().Get("Content-Encoding"); got != tt.wantCE {
				t.Fatalf("Content-Encoding = %q, want %q", got, tt.wantCE)
			}
			got := rec.Body.Bytes()
			if tt.wantCE == "gzip" {
				if !bytes.Equal(got, first.Body.Bytes()) {
					t.Errorf("gzip replay differs from the first answer's bytes")
				}
				got = gunzip(t, got)
			}
			if !bytes.Equal(got, tt.wantBody) {
				t.Errorf("body = %.60q…, want %.60q…", got, tt.wantBody)
			}
		})
	}
}

// TestReplayEncodingOutside: with compression outside the middleware (the
// placement the README recommends) the stored body is identity, and each
// retry is compressed as it asks.
func TestReplayEncodingOutside(t *testing.T) {
	t.Parallel()
	report := []byte(`{"report":"` + strings.Repeat("all quiet; ", 200) + `"}`)
	v := newEnv(t, nil, nil)
	e := echo.New()
	e.Use(echomw.Gzip())
	e.POST("/v1/report", func(c echo.Context) error {
		v.calls.Add(1)
		return c.Blob(http.StatusCreated, "application/json", report)
	}, middleware.New(middleware.Config{Store: v.store, Scope: testScope}))
	v.e = e
	for i, ae := range []string{"gzip", "", "gzip"} {
		rec := v.send("/v1/report", ae)
		body := rec.Body.Bytes()
		if ae == "gzip" {
			if rec.Header().Get("Content-Encoding") != "gzip" {
				t.Fatalf("request %d: Content-Encoding %q", i, rec.Header().Get("Content-Encoding"))
			}
			body = gunzip(t, body)
		}
		if !bytes.Equal(body, report) || rec.Code != 201 {
			t.Fatalf("request %d = %d, body differs", i, rec.Code)
		}
	}
	if v.calls.Load() != 1 {
		t.Errorf("handler ran %d times", v.calls.Load())
	}
}

// TestReplayDecodedContentLength: with ReplayHeaders naming
// Content-Length, a replay decoded for a retry that does not accept gzip
// says the decoded body's length, not the stored compressed one (with
// which a client reads too few bytes or waits for more).
func TestReplayDecodedContentLength(t *testing.T) {
	t.Parallel()
	plain := []byte(`{"report":"` + strings.Repeat("all quiet; ", 200) + `"}`)
	z := gzipOf(t, plain, 1)
	v := newEnv(t, nil, nil)
	e := echo.New()
	e.POST("/v1/report", func(c echo.Context) error {
		v.calls.Add(1)
		h := c.Response().Header()
		h.Set("Content-Encoding", "gzip")
		h.Set("Content-Length", strconv.Itoa(len(z)))
		return c.Blob(http.StatusCreated, "application/json", z)
	}, middleware.New(middleware.Config{Store: v.store, Scope: testScope,
		ReplayHeaders: []string{"Content-Type", "Content-Encoding", "Content-Length"}}))
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	send := func(acceptEncoding string) (*http.Response, []byte) {
		t.Helper()
		r, _ := http.NewRequest("POST", srv.URL+"/v1/report", strings.NewReader(imageBody))
		r.Header.Set("Idempotency-Key", "k")
		r.Header.Set("X-Tenant", "acme")
		r.Header.Set("X-User", "alice")
		r.Header.Set("Content-Type", "application/json")
		if acceptEncoding != "" {
			r.Header.Set("Accept-Encoding", acceptEncoding)
		}
		resp, err := client.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("read the answer to Accept-Encoding %q: %v", acceptEncoding, err)
		}
		return resp, body
	}
	if resp, body := send("gzip"); resp.StatusCode != 201 || !bytes.Equal(body, z) {
		t.Fatalf("first = %d, %d bytes, want 201 with the %d gzip bytes", resp.StatusCode, len(body), len(z))
	}
	resp, body := send("")
	if resp.StatusCode != 201 || !bytes.Equal(body, plain) {
		t.Fatalf("retry without gzip = %d, %d bytes, want 201 with the %d decoded bytes", resp.StatusCode, len(body), len(plain))
	}
	if got := resp.Header.Get("Content-Length"); got != strconv.Itoa(len(plain)) {
		t.Errorf("Content-Length = %s, want %d", got, len(plain))
	}
	if resp, body := send("gzip"); !bytes.Equal(body, z) || resp.Header.Get("Content-Length") != strconv.Itoa(len(z)) {
		t.Errorf("retry with gzip = %d bytes, Content-Length %s, want the %d stored bytes", len(body), resp.Header.Get("Content-Length"), len(z))
	}
	if n := v.calls.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

// gzipOf compresses b, as many concatenated gzip members as members says.
func gzipOf(t *testing.T, b []byte, members int) []byte {
	t.Helper()
	var out bytes.Buffer
	for range members {
		zw, _ := gzip.NewWriterLevel(&out, gzip.BestCompression)
		zw.Write(b)
		zw.Close()
	}
	return out.Bytes()
}

// TestReplayGzipBomb: a stored gzip body that decodes to far more
// than MaxResponseBytes (64 MiB of zeros in 64 KiB, or many members of
// it) is refused with 406 for a retry that does not accept gzip, and the
// decoding stops at the limit: the replay allocates a few MiB, not 64.
//
// It reads the process-wide allocation count, so it is not parallel: a
// sequential test runs while every parallel test of the package waits.
func TestReplayGzipBomb(t *testing.T) {
	for _, tt := range []struct {
		name    string
		bomb    []byte
		members int
	}{
		{"one member", make([]byte, 64<<20), 1},
		{"many members", make([]byte, 4<<20), 16},
	} {
		t.Run(tt.name, func(t *testing.T) {
			z := gzipOf(t, tt.bomb, tt.members)
			v := encodingEnv(t, z, "gzip", nil)
			if rec := v.send("/v1/report", "gzip"); rec.Code != http.StatusCreated || !bytes.Equal(rec.Body.Bytes(), z) {
				t.Fatalf("first = %d (%d bytes), want 201 with the %d gzip bytes", rec.Code, rec.Body.Len(), len(z))
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			rec := v.send("/v1/report", "")
			runtime.ReadMemStats(&after)
			if rec.Code != http.StatusNotAcceptable || problemCode(t, rec) != "encoding_not_acceptable" {
				t.Fatalf("retry without gzip = %d %s, want 406 encoding_not_acceptable", rec.Code, rec.Body)
			}
			// The limit is 1 MiB; 16 MiB leaves room for background
			// goroutines and is still far below the bomb.
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
				t.Errorf("the refused replay allocated %d MiB", grew>>20)
			}
			if n := v.calls.Load(); n != 1 {
				t.Errorf("handler ran %d times, want 1", n)
			}
		})
	}
}

// TestReplayDecodedVary: a replay decoded because the retry did not
// accept gzip was chosen by Accept-Encoding, so it says Vary:
// Accept-Encoding even when the handler that gzipped its own answer did
// not: a shared cache must not hand the identity copy to every client, nor
// mistake it for the stored one.
func TestReplayDecodedVary(t *testing.T) {
	t.Parallel()
	plain := []byte(`{"report":"` + strings.Repeat("a", 2000) + `"}`)
	v := encodingEnv(t, gzipOf(t, plain, 1), "gzip", nil)
	v.send("/v1/report", "gzip")
	rec := v.send("/v1/report", "")
	if rec.Code != http.StatusCreated || !bytes.Equal(rec.Body.Bytes(), plain) || rec.Header().Get("Content-Encoding") != "" {
		t.Fatalf("retry without gzip = %d %q (%d bytes), want 201 decoded", rec.Code, rec.Header().Get("Content-Encoding"), rec.Body.Len())
	}
	if !strings.Contains(strings.Join(rec.Header().Values("Vary"), ","), "Accept-Encoding") {
		t.Errorf("decoded replay has Vary %q, want Accept-Encoding in it", rec.Header().Values("Vary"))
	}
}
