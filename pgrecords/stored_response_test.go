package pgrecords_test

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/testenv"
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
		mustClaim(t, s, k, other, idemgate.Mismatch)
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
	want := idemgate.Response{Status: 299, Header: h, Body: body}
	k := key()
	req := request(time.Minute)
	mustClaim(t, s, k, req, idemgate.Claimed)
	if err := s.Complete(testCtx(t), k, req.Token, want, time.Hour); err != nil {
		t.Fatal(err)
	}
	r := req
	r.Token = token()
	got := mustClaim(t, s, k, r, idemgate.Finished).Response
	if d := sameResponse(got, want); d != "" {
		t.Errorf("replay differs: %s", d)
	}
}

// sameResponse returns how got differs from want, or "" when it does
// not: the status, the body byte for byte, and each header name's values
// (a name with no values kept as one; a nil header the same as an empty
// one).
func sameResponse(got, want idemgate.Response) string {
	if got.Status != want.Status {
		return fmt.Sprintf("status %d, want %d", got.Status, want.Status)
	}
	if !bytes.Equal(got.Body, want.Body) {
		return fmt.Sprintf("body of %d bytes differs from the %d bytes wanted", len(got.Body), len(want.Body))
	}
	if len(got.Header) != len(want.Header) {
		return fmt.Sprintf("header has %d names, want %d", len(got.Header), len(want.Header))
	}
	for name, values := range want.Header {
		g, ok := got.Header[name]
		switch {
		case !ok:
			return fmt.Sprintf("header %q missing", name)
		case !slices.Equal(g, values):
			return fmt.Sprintf("header %q = %q, want %q", name, g, values)
		}
	}
	return ""
}

// oddResponses are responses a handler may answer that stretch the
// stored response's encoding: no body or header, NUL bytes, names with no
// or empty values, an empty name, many values and names, bytes that are
// not UTF-8, a large binary body, a status above 599, and lengths that
// take more than one varint byte.
func oddResponses() map[string]idemgate.Response {
	many := make([]string, 2000)
	for i := range many {
		many[i] = fmt.Sprintf("v%d", i)
	}
	names := http.Header{}
	for i := range 500 {
		names[fmt.Sprintf("X-N%d", i)] = []string{strings.Repeat("y", i)}
	}
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	return map[string]idemgate.Response{
		"nil body, nil header":               {Status: 204},
		"empty body, empty header":           {Status: 200, Header: http.Header{}, Body: []byte{}},
		"NUL body":                           {Status: 201, Body: []byte("\x00\x00\x00")},
		"one NUL":                            {Status: 201, Body: []byte{0}},
		"name with no values":                {Status: 200, Header: http.Header{"X-Empty": {}}, Body: []byte("x")},
		"empty values":                       {Status: 200, Header: http.Header{"X-E": {"", "", ""}}},
		"empty name":                         {Status: 200, Header: http.Header{"": {"v"}}},
		"many values":                        {Status: 200, Header: http.Header{"X-Many": many}},
		"many names":                         {Status: 200, Header: names},
		"non-ASCII and invalid UTF-8":        {Status: 200, Header: http.Header{"X-Ünï": {"日本語", "\xff\xfe\x00", "é"}}, Body: []byte("\xff\xfe")},
		"1 MiB binary body":                  {Status: 200, Header: http.Header{"Content-Type": {"application/octet-stream"}}, Body: big},
		"status 999":                         {Status: 999, Body: []byte("odd")},
		"value of 300 bytes (2-byte length)": {Status: 200, Header: http.Header{"X-L": {strings.Repeat("z", 300)}}},
	}
}

// TestOddResponsesReplayInEveryExecMode: each of oddResponses, stored by
// Complete, comes back from a claim byte for byte on pools in every exec
// mode: the claim's own decoding of the binary row, and the scan of the
// text one.
func TestOddResponsesReplayInEveryExecMode(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	newStore(t, newPool(t, dsn)) // migrate once
	for _, mode := range allExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			pool := poolWith(t, dsn, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })
			s, err := pgrecords.New(testCtx(t), pool)
			if err != nil {
				t.Fatal(err)
			}
			for name, resp := range oddResponses() {
				k := key()
				req := request(time.Minute)
				mustClaim(t, s, k, req, idemgate.Claimed)
				if err := s.Complete(testCtx(t), k, req.Token, resp, time.Hour); err != nil {
					t.Fatalf("%s: Complete: %v", name, err)
				}
				again := req
				again.Token = token()
				if d := sameResponse(mustClaim(t, s, k, again, idemgate.Finished).Response, resp); d != "" {
					t.Errorf("%s: replay: %s", name, d)
				}
			}
		})
	}
}
