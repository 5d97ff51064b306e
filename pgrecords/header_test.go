package pgrecords

import (
	"net/http"
	"reflect"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []http.Header{
		nil,
		{"Content-Type": {"application/json"}},
		{"X-Multi": {"one", "", "two, three"}, "Location": {"/v1/tasks/42"}, "X-Bin": {"\x00\xff"}},
		{"X-Empty": {}},
	} {
		got, err := decodeHeader(appendHeader(nil, h))
		if err != nil {
			t.Fatalf("decode(%v): %v", h, err)
		}
		if len(got) != len(h) || (len(h) > 0 && !reflect.DeepEqual(got, h)) {
			t.Errorf("round trip of %v = %v", h, got)
		}
	}
	for _, bad := range [][]byte{{}, {1}, {1, 5, 'a'}, {0, 0}, {1, 1, 'a', 1, 9}, {0x80}} {
		if _, err := decodeHeader(bad); err == nil {
			t.Errorf("decodeHeader(%x) succeeded", bad)
		}
	}
}

// FuzzDecodeHeader: any bytes decode or fail without a panic, and what
// decodes encodes back to a header that decodes the same.
func FuzzDecodeHeader(f *testing.F) {
	f.Add(appendHeader(nil, http.Header{"Content-Type": {"application/json"}, "X": {"a", "b"}}))
	f.Add([]byte{0})
	f.Add([]byte{1, 1, 'a', 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeHeader(b)
		if err != nil {
			return
		}
		again, err := decodeHeader(appendHeader(nil, h))
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if len(again) != len(h) || (len(h) > 0 && !reflect.DeepEqual(again, h)) {
			t.Fatalf("round trip %v -> %v", h, again)
		}
	})
}
