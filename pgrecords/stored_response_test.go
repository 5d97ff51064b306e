package pgrecords_test

import (
	"bytes"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
)

// TestCorruptRows: rows no store wrote (a finished record without
// a response, bad response bytes, an impossible status, a truncated
// header) make Claim return an error for the matching request, never a
// panic or a replay of garbage; a mismatching request still gets a bare
// Mismatch.
func TestCorruptRows(t *testing.T) {
	t.Parallel()
	pool := newPool(t, testenv.PostgresDSN(t))
	s := newStore(t, pool)
	for name, response := range map[string][]byte{
		"null":             nil,
		"empty":            {},
		"one byte":         {0},
		"status 0":         {0, 0, 0},
		"status 65535":     {0xff, 0xff, 0},
		"names overflow":   {0, 200, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"names too many":   {0, 200, 0x7f},
		"value overflow":   {0, 200, 1, 1, 'a', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"string too long":  {0, 200, 1, 0x7f, 'a'},
		"varint unfinised": {0, 200, 0x80, 0x80},
	} {
		k := key()
		req := request(time.Minute)
		if _, err := pool.Exec(testCtx(t), `INSERT INTO idemgate_records (key, token, finished, expires_at, ident, response)
			VALUES ($1, gen_random_uuid(), true, now() + interval '1 hour', $2, $3)`, k, pgrecords.Ident(req), response); err != nil {
			t.Fatal(err)
		}
		res, err := s.Claim(testCtx(t), k, req)
		if err == nil {
			t.Errorf("%s: Claim = %+v, want an error", name, res)
		}
		other := req
		other.Fingerprint += "x"
		mustClaim(t, s, k, other, middleware.Mismatch)
	}
}

// TestLargeResponse: a response of several MB with many headers
// (binary values, empty values, repeated names) replays byte for byte,
// through the claim statement's single response column.
func TestLargeResponse(t *testing.T) {
	t.Parallel()
	s := newStore(t, newPool(t, testenv.PostgresDSN(t)))
	body := make([]byte, 6<<20)
	for i := range body {
		body[i] = byte(i*31 + i>>8)
	}
	h := http.Header{}
	for i := range 500 {
		name := fmt.Sprintf("X-H%d", i)
		h[name] = []string{strings.Repeat("v", i), "", "\x00\xff" + name}
	}
	h["X-None"] = []string{}
	want := middleware.Response{Status: 299, Header: h, Body: body}
	k := key()
	req := request(time.Minute)
	mustClaim(t, s, k, req, middleware.Claimed)
	if err := s.Complete(testCtx(t), k, req.Token, want, time.Hour); err != nil {
		t.Fatal(err)
	}
	r := req
	r.Token = token()
	got := mustClaim(t, s, k, r, middleware.Finished).Response
	if got.Status != want.Status || !bytes.Equal(got.Body, want.Body) || !reflect.DeepEqual(got.Header, want.Header) {
		t.Errorf("replay differs: status %d, %d body bytes (equal %v), %d headers (equal %v)",
			got.Status, len(got.Body), bytes.Equal(got.Body, want.Body), len(got.Header), reflect.DeepEqual(got.Header, want.Header))
	}
}
