package idemgate

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/wire"
)

// TestReplayStoredAgrees: a response the Redis store hands over undecoded
// is replayed exactly as its decoded Response would be: status, every
// header (a later entry of a name replacing an earlier one, a stored
// Idempotent-Replayed overwritten), body, event; with a Content-Encoding
// the request does not accept, decoded or refused alike.
func TestReplayStoredAgrees(t *testing.T) {
	t.Parallel()
	var encoded [][]byte
	for _, r := range []Response{
		{Status: 204},
		{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "", "b"}, "X-Empty": {}}, Body: []byte("{}\x00\xff")},
		{Status: 200, Header: http.Header{"Location": {"/v1/tasks/1"}, "Idempotent-Replayed": {"no"}}, Body: []byte("x")},
		{Status: 200, Header: http.Header{"Content-Encoding": {"gzip"}, "Content-Type": {"text/plain; charset=utf-8"}}, Body: gzipBytes("hello")},
		{Status: 200, Header: http.Header{"Content-Encoding": {"br"}}, Body: []byte("?")},
		{Status: 200, Header: http.Header{"Content-Encoding": {}}, Body: []byte("plain")},
	} {
		enc, err := wire.AppendResponse(nil, r.Status, r.Header, r.Body)
		if err != nil {
			t.Fatal(err)
		}
		encoded = append(encoded, enc, v1Response(nil, r))
	}
	// Hand-built version 2 entries: a name twice (the last one holds),
	// Content-Encoding with values, then without.
	encoded = append(encoded,
		[]byte("\xc8\x01\x03\x00\x05X-Dup\x01\x00\x01a\x00\x05X-Dup\x02\x00\x01b\x00\x01c\x06\x01\x0bbody"),
		[]byte("\xc8\x01\x02\x06\x01\x0b\x06\x00body"),
	)
	for _, accept := range []string{"", "gzip"} {
		for _, enc := range encoded {
			want, wantEv, wantErr := replayWith(t, accept, func(st *call, w http.ResponseWriter, r *http.Request) error {
				status, header, body, err := wire.Decode(string(enc))
				if err != nil {
					t.Fatal(err)
				}
				return st.replay(w, r, Response{Status: status, Header: header, Body: body})
			})
			got, gotEv, gotErr := replayWith(t, accept, func(st *call, w http.ResponseWriter, r *http.Request) error {
				sr, err := wire.Check(string(enc))
				if err != nil {
					t.Fatal(err)
				}
				return st.replayStored(w, r, &sr)
			})
			if got.Code != want.Code || !reflect.DeepEqual(got.Header(), want.Header()) || !bytes.Equal(got.Body.Bytes(), want.Body.Bytes()) {
				t.Errorf("accept %q, %q: replayStored wrote %d %v %q; replay %d %v %q", accept, enc,
					got.Code, got.Header(), got.Body, want.Code, want.Header(), want.Body)
			}
			if gotErr != wantErr {
				t.Errorf("accept %q, %q: replayStored's error %q, replay's %q", accept, enc, gotErr, wantErr)
			}
			if !reflect.DeepEqual(gotEv, wantEv) {
				t.Errorf("accept %q, %q: events %+v, want %+v", accept, enc, gotEv, wantEv)
			}
		}
	}
}

func replayWith(t *testing.T, accept string, replay func(*call, http.ResponseWriter, *http.Request) error) (*httptest.ResponseRecorder, []Event, string) {
	t.Helper()
	var events []Event
	m := &Engine{cfg: EngineConfig{MaxResponseBytes: 1 << 20, OnEvent: func(_ context.Context, e Event) { e.Latency = 0; events = append(events, e) }}}
	m.now = func() time.Time { return time.Time{} }
	st := &call{m: m, rt: &route{name: "POST /x", kind: "x"}, d: &testDoor{}}
	r := httptest.NewRequest(http.MethodPost, "/x", nil)
	if accept != "" {
		r.Header.Set("Accept-Encoding", accept)
	}
	w := httptest.NewRecorder()
	var msg string
	if err := replay(st, w, r); err != nil {
		msg = err.Error()
	}
	return w, events, msg
}

// v1Response encodes r in the record format's version 1, which stores
// written before version 2 still hold.
func v1Response(b []byte, r Response) []byte {
	b = append(b, 1)
	b = binary.AppendUvarint(b, uint64(r.Status))
	b = binary.AppendUvarint(b, uint64(len(r.Header)))
	for name, values := range r.Header {
		b = v1String(b, name)
		b = binary.AppendUvarint(b, uint64(len(values)))
		for _, v := range values {
			b = v1String(b, v)
		}
	}
	return append(b, r.Body...)
}

func v1String(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func gzipBytes(s string) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write([]byte(s))
	zw.Close()
	return b.Bytes()
}
