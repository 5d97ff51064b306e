package idemgate

import (
	"io"
	"math"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
)

// TestReadBodyAllocatesWhatArrives: a large Content-Length with a tiny body
// must not make the server allocate the declared size up front.
func TestReadBodyAllocatesWhatArrives(t *testing.T) {
	// Not parallel: it measures the process's allocations.
	const declared, calls = 1 << 20, 16
	read := func() {
		r := httptest.NewRequest("POST", "/", io.NopCloser(strings.NewReader("tiny")))
		r.ContentLength = declared
		if _, err := readBody(r, 2*declared); err != errBodyShort {
			t.Fatalf("readBody of a short body: err = %v, want errBodyShort", err)
		}
	}
	read()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range calls {
		read()
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > calls*declared/4 {
		t.Errorf("%d reads of a 4-byte body declared as %d bytes allocated %d bytes", calls, declared, got)
	}
}

func TestReadBody(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		body    string
		length  int64 // Content-Length; -1 unknown
		limit   int64
		wantErr error
	}{
		{name: "exact", body: "hello", length: 5, limit: 10},
		{name: "unknown length", body: strings.Repeat("x", 3000), length: -1, limit: 4000},
		{name: "large exact", body: strings.Repeat("x", 200<<10), length: 200 << 10, limit: 1 << 20},
		{name: "short", body: "hel", length: 5, limit: 10, wantErr: errBodyShort},
		{name: "longer than declared", body: "hello!", length: 5, limit: 10, wantErr: errBodyTooLarge},
		{name: "declared over limit", body: "hello", length: 5, limit: 4, wantErr: errBodyTooLarge},
		{name: "unknown length over limit", body: strings.Repeat("x", 3000), length: -1, limit: 2999, wantErr: errBodyTooLarge},
		// math.MaxInt64 is a natural "no limit": limit+1 must not wrap.
		{name: "unknown length, no limit", body: strings.Repeat("x", 3000), length: -1, limit: math.MaxInt64},
		{name: "exact, no limit", body: strings.Repeat("x", 3000), length: 3000, limit: math.MaxInt64},
		{name: "declared MaxInt64, no limit", body: "tiny", length: math.MaxInt64, limit: math.MaxInt64, wantErr: errBodyTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest("POST", "/", io.NopCloser(strings.NewReader(tt.body)))
			r.ContentLength = tt.length
			got, err := readBody(r, tt.limit)
			if err != tt.wantErr {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err == nil && string(got) != tt.body {
				t.Errorf("body = %d bytes, want %d", len(got), len(tt.body))
			}
		})
	}
}
