package middleware

import (
	"bytes"
	"compress/gzip"
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
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
		enc, err := appendResponse(nil, r)
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
			want, wantEv, wantErr := replayWith(t, accept, func(st *call, c echo.Context) error {
				r, err := decodeResponse(string(enc))
				if err != nil {
					t.Fatal(err)
				}
				return st.replay(c, r)
			})
			got, gotEv, gotErr := replayWith(t, accept, func(st *call, c echo.Context) error {
				sr, err := checkResponse(string(enc))
				if err != nil {
					t.Fatal(err)
				}
				return st.replayStored(c, &sr)
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

func replayWith(t *testing.T, accept string, replay func(*call, echo.Context) error) (*httptest.ResponseRecorder, []Event, string) {
	t.Helper()
	var events []Event
	m := &idem{cfg: Config{MaxResponseBytes: 1 << 20, OnEvent: func(_ context.Context, e Event) { e.Latency = 0; events = append(events, e) }}}
	m.now = func() time.Time { return time.Time{} }
	st := &call{m: m, rt: &route{name: "POST /x", kind: "x"}}
	r := httptest.NewRequest(http.MethodPost, "/x", nil)
	if accept != "" {
		r.Header.Set("Accept-Encoding", accept)
	}
	w := httptest.NewRecorder()
	var msg string
	if err := replay(st, echo.New().NewContext(r, w)); err != nil {
		msg = err.Error()
	}
	return w, events, msg
}

func gzipBytes(s string) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write([]byte(s))
	zw.Close()
	return b.Bytes()
}
