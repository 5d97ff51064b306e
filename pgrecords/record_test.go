package pgrecords

import (
	"bytes"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/idemgate/idemgate"
)

func TestResponseRoundTrip(t *testing.T) {
	for _, r := range []idemgate.Response{
		{Status: 200},
		{Status: 202, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":1}`)},
		{Status: 409, Header: http.Header{"X-Multi": {"one", "", "two, three"}, "Location": {"/v1/tasks/42"}, "X-Bin": {"\x00\xff"}}, Body: []byte{0, 1, 2}},
		{Status: 999, Header: http.Header{"X-Empty": {}}, Body: []byte("\x00")},
		{Status: 200, Header: http.Header{"X-Long": {strings.Repeat("v", 300)}}, Body: bytes.Repeat([]byte{1}, 20000)},
	} {
		stored := appendResponse(nil, r)
		if len(stored) != responseLen(r) {
			t.Errorf("stored status %d in %d bytes, responseLen %d", r.Status, len(stored), responseLen(r))
		}
		got, err := decodeResponse(stored)
		if err != nil {
			t.Fatalf("decode(%v): %v", r, err)
		}
		if got.Status != r.Status || !bytes.Equal(got.Body, r.Body) || len(got.Header) != len(r.Header) ||
			(len(r.Header) > 0 && !reflect.DeepEqual(got.Header, r.Header)) {
			t.Errorf("round trip of %+v = %+v", r, got)
		}
	}
	for _, bad := range [][]byte{{}, {0}, {0, 99, 0}, {0x03, 0xe8, 0}, {0, 200}, {0, 200, 1}, {0, 200, 1, 5, 'a'}, {0, 200, 1, 1, 'a', 1, 9}, {0, 200, 0x80}} {
		if _, err := decodeResponse(bad); err == nil {
			t.Errorf("decodeResponse(%x) succeeded", bad)
		}
	}
}

func TestIdentScope(t *testing.T) {
	const fp = "v1:00ff"
	mine := appendIdent(nil, "owner-a", "image", fp)
	for _, c := range []struct {
		owner, kind, fp string
		same            bool
	}{
		{"owner-a", "image", fp, true},
		{"owner-a", "image", "v1:11ee", true},
		{"owner-a", "image", "", true},
		{"owner-b", "image", fp, false},
		{"owner-a", "video", fp, false},
		// Length prefixes keep a shifted boundary apart.
		{"owner-ai", "mage", fp, false},
		{"owner-", "aimage", fp, false},
		{"", "", "", false},
	} {
		held := appendIdent(nil, c.owner, c.kind, c.fp)
		if got := sameScope(held, mine, len(fp)); got != c.same {
			t.Errorf("sameScope(%q %q %q) = %v, want %v", c.owner, c.kind, c.fp, got, c.same)
		}
	}
}

// FuzzDecodeResponse: any bytes decode or fail without a panic, and what
// decodes encodes back to the same bytes' response.
func FuzzDecodeResponse(f *testing.F) {
	f.Add(appendResponse(nil, idemgate.Response{Status: 202, Header: http.Header{"Content-Type": {"application/json"}, "X": {"a", "b"}}, Body: []byte("{}")}))
	f.Add([]byte{0, 200, 0})
	f.Add([]byte{0, 200, 1, 1, 'a', 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeResponse(b)
		if err != nil {
			return
		}
		again, err := decodeResponse(appendResponse(nil, r))
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if again.Status != r.Status || !bytes.Equal(again.Body, r.Body) || len(again.Header) != len(r.Header) ||
			(len(r.Header) > 0 && !reflect.DeepEqual(again.Header, r.Header)) {
			t.Fatalf("round trip %+v -> %+v", r, again)
		}
	})
}
