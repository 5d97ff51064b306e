package doortest

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"strings"
	"testing"
)

// testEncodings: a replay never sends a Content-Encoding the retry did not
// accept. An answer the handler gzipped itself is stored as it went out;
// a retry that accepts gzip gets those bytes, one that does not gets them
// decoded (with Vary: Accept-Encoding, as its body was chosen by that
// header). A coding the middleware cannot decode is refused with 406
// encoding_not_acceptable.
func testEncodings(t *testing.T, b bundle) {
	plain := []byte(`{"report":"` + strings.Repeat("all quiet; ", 200) + `"}`)
	zipped := gzipOf(t, plain)
	tests := []struct {
		name     string
		coding   string // the handler's Content-Encoding
		body     []byte // the handler's body
		retryAE  string // Accept-Encoding of the retry
		want     want
		wantCE   string // Content-Encoding of the retry's answer
		wantBody []byte // the retry's body; nil: not checked
		wantVary bool   // Vary names Accept-Encoding
	}{
		{name: "a gzip answer is decoded for a retry without Accept-Encoding", coding: "gzip", body: zipped,
			want:     want{status: 201, calls: 1, replayed: true, events: "claimed,replayed(decoded)"},
			wantBody: plain, wantVary: true},
		{name: "a gzip answer is decoded for a retry that refuses gzip", coding: "gzip", body: zipped, retryAE: "gzip;q=0, identity",
			want:     want{status: 201, calls: 1, replayed: true, events: "claimed,replayed(decoded)"},
			wantBody: plain, wantVary: true},
		{name: "a gzip answer is replayed as stored to a retry that accepts gzip", coding: "gzip", body: zipped, retryAE: "deflate, GZIP;q=0.5",
			want:   want{status: 201, calls: 1, replayed: true, events: "claimed,replayed"},
			wantCE: "gzip", wantBody: zipped},
		{name: "an identity answer is replayed as stored to a retry that accepts gzip", body: plain, retryAE: "gzip",
			want:     want{status: 201, calls: 1, replayed: true, events: "claimed,replayed"},
			wantBody: plain},
		{name: "a coding the middleware cannot decode is encoding_not_acceptable", coding: "br", body: []byte("not really brotli"), retryAE: "gzip",
			want: want{status: 406, code: "encoding_not_acceptable", calls: 1, events: "claimed,replayed(encoding_not_acceptable)"}},
		{name: "a coding accepted by a wildcard is replayed", coding: "br", body: []byte("not really brotli"), retryAE: "gzip, *;q=0.1",
			want:   want{status: 201, calls: 1, replayed: true},
			wantCE: "br", wantBody: []byte("not really brotli")},
		{name: "a corrupt gzip answer is encoding_not_acceptable", coding: "gzip", body: []byte("not gzip at all"),
			want: want{status: 406, code: "encoding_not_acceptable", calls: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := b.serve(t, nil, func(w http.ResponseWriter, _ *http.Request, _ int64) {
				w.Header().Set("Content-Type", "application/json")
				if tt.coding != "" {
					w.Header().Set("Content-Encoding", tt.coding)
				}
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write(tt.body)
			})
			first := s.do(t, req{key: "k", body: imageBody, acceptEncoding: "gzip, br"})
			if first.Code != http.StatusCreated || !bytes.Equal(first.Body.Bytes(), tt.body) {
				t.Fatalf("first request = %d (%d bytes), want 201 with the handler's %d bytes", first.Code, first.Body.Len(), len(tt.body))
			}
			rec := s.do(t, req{key: "k", body: imageBody, acceptEncoding: tt.retryAE})
			tt.want.check(t, s, rec)
			if got := rec.Header().Get("Content-Encoding"); got != tt.wantCE {
				t.Errorf("Content-Encoding = %q, want %q", got, tt.wantCE)
			}
			if tt.wantBody != nil && !bytes.Equal(rec.Body.Bytes(), tt.wantBody) {
				t.Errorf("body = %.60q… (%d bytes), want %.60q… (%d bytes)", rec.Body, rec.Body.Len(), tt.wantBody, len(tt.wantBody))
			}
			vary := strings.Contains(strings.Join(rec.Header().Values("Vary"), ","), "Accept-Encoding")
			if tt.wantVary && !vary {
				t.Errorf("Vary = %q, want Accept-Encoding in it", rec.Header().Values("Vary"))
			}
		})
	}
}

func gzipOf(t *testing.T, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	// Check that it decodes, so that a failure below is the door's.
	zr, err := gzip.NewReader(bytes.NewReader(out.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(zr); err != nil || !bytes.Equal(got, b) {
		t.Fatalf("gzip round trip: %v", err)
	}
	return out.Bytes()
}
