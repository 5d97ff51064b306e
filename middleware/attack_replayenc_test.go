package middleware_test

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"runtime"
	"strings"
	"testing"
)

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

// TestAttackReplayGzipBomb: a stored gzip body that decodes to far more
// than MaxResponseBytes (64 MiB of zeros in 64 KiB, or many members of
// it) is refused with 406 for a retry that does not accept gzip, and the
// decoding stops at the limit: the replay allocates a few MiB, not 64.
func TestAttackReplayGzipBomb(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		bomb    []byte
		members int
	}{
		{"one member", make([]byte, 64<<20), 1},
		{"many members", make([]byte, 4<<20), 16},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
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
			// Parallel tests allocate too; 16 MiB is far below the bomb.
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
				t.Errorf("the refused replay allocated %d MiB", grew>>20)
			}
			if n := v.calls.Load(); n != 1 {
				t.Errorf("handler ran %d times, want 1", n)
			}
		})
	}
}

// TestAttackReplayDecodedVary: a replay decoded because the retry did not
// accept gzip was chosen by Accept-Encoding, so it says Vary:
// Accept-Encoding even when the handler that gzipped its own answer did
// not: a shared cache must not hand the identity copy to every client, nor
// mistake it for the stored one.
func TestAttackReplayDecodedVary(t *testing.T) {
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
