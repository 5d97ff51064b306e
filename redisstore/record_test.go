package redisstore

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/keyspace"
)

// The version 1 encoder, copied from redis.go as it was before records
// version 2 (commit db86706), to write the records that a store upgraded
// from it finds.

func v1Claim(tok idemgate.Token, req idemgate.ClaimRequest) []byte {
	b := []byte{'C'}
	b = append(b, tok[:]...)
	b = v1String(b, string(req.Fingerprint))
	b = v1String(b, req.Owner)
	return v1String(b, req.Kind)
}

func v1Finished(tok idemgate.Token, req idemgate.ClaimRequest, r idemgate.Response) []byte {
	b := v1Claim(tok, req)
	b[0] = 'F'
	return v1Response(b, r)
}

func v1Response(b []byte, r idemgate.Response) []byte {
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

func sameResponse(t *testing.T, got, want idemgate.Response) {
	t.Helper()
	if got.Status != want.Status || !bytes.Equal(got.Body, want.Body) || len(got.Header) != len(want.Header) {
		t.Fatalf("response = %d %v %q, want %d %v %q", got.Status, got.Header, got.Body, want.Status, want.Header, want.Body)
	}
	for k, v := range want.Header {
		if len(v) == 0 && len(got.Header[k]) == 0 {
			continue
		}
		if !reflect.DeepEqual(got.Header[k], v) {
			t.Errorf("header %s = %q, want %q", k, got.Header[k], v)
		}
	}
}

func TestResponseEncoding(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		given idemgate.Response
	}{
		{"empty", idemgate.Response{Status: 204}},
		{"headers and binary body", idemgate.Response{Status: 201,
			Header: http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "", "b"}, "X-Empty": {}},
			Body:   []byte("{}\x00\xff")}},
		{"table names with other values", idemgate.Response{Status: 200,
			Header: http.Header{"Location": {"/v1/tasks/1"}, "Retry-After": {"1", "0"}, "content-type": {"application/json"}}}},
		{"large status code range", idemgate.Response{Status: 599, Body: bytes.Repeat([]byte{0x80}, 300)}},
		{"lowest status", idemgate.Response{Status: 100}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			enc, err := appendResponse(nil, tt.given)
			if err != nil {
				t.Fatal(err)
			}
			if enc[0] == responseV1 {
				t.Fatalf("a version 2 response starts with the version 1 byte")
			}
			got, err := decodeResponse(string(enc))
			if err != nil {
				t.Fatal(err)
			}
			sameResponse(t, got, tt.given)
			// The same response in version 1 decodes alike.
			got, err = decodeResponse(string(v1Response(nil, tt.given)))
			if err != nil {
				t.Fatal(err)
			}
			sameResponse(t, got, tt.given)
		})
	}
	for _, status := range []int{0, 99, 1000} {
		if _, err := appendResponse(nil, idemgate.Response{Status: status}); err == nil {
			t.Errorf("status %d encoded", status)
		}
	}
}

// TestResponseCompact: table names and values take one byte each.
func TestResponseCompact(t *testing.T) {
	t.Parallel()
	r := idemgate.Response{Status: 202, Header: http.Header{"Content-Type": {"application/json"}, "Retry-After": {"1"}}, Body: []byte("{}")}
	enc, _ := appendResponse(nil, r)
	if want := 2 + 1 + 2*3 + 2; len(enc) != want {
		t.Errorf("encoded in %d bytes, want %d", len(enc), want)
	}
}

func TestStoreKey(t *testing.T) {
	t.Parallel()
	key, err := keyspace.Derive("images", keyspace.Scope{Tenant: "acme", User: "u1", Request: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	s := key.String()
	tests := []struct {
		name        string
		key         string
		owner, kind string
		wantKey     string // "" = compact
		wantImplied bool
	}{
		{"keyspace key", s, key.Owner(), key.Kind(), "", true},
		{"other owner", s, strings.Repeat("0", 64), key.Kind(), "", false},
		{"other kind", s, key.Owner(), "image", "", false},
		{"not a keyspace key", "idem:storetest:test:0123", "o", "k", "idem:storetest:test:0123", false},
		{"upper-case hex", strings.ToUpper(s[:len(s)-64]) + strings.ToUpper(s[len(s)-64:]), key.Owner(), key.Kind(), strings.ToUpper(s[:len(s)-64]) + strings.ToUpper(s[len(s)-64:]), false},
		{"extra segment", "idem:a:b:c:" + s[len(s)-129:], key.Owner(), "c", "idem:a:b:c:" + s[len(s)-129:], false},
		{"other prefix", "Idem" + s[4:], key.Owner(), key.Kind(), "Idem" + s[4:], false},
	}
	for _, tc := range tests {
		got, implied := storeKey(tc.key, tc.owner, tc.kind)
		if tc.wantKey == "" {
			if want := "idem:acme:images:{}"; !strings.HasPrefix(got, want) || len(got) != len(want)+32 {
				t.Errorf("%s: key %q, want %q and 32 bytes", tc.name, got, want)
			}
		} else if got != tc.wantKey {
			t.Errorf("%s: key %q, want %q", tc.name, got, tc.wantKey)
		}
		if implied != tc.wantImplied {
			t.Errorf("%s: implied %v, want %v", tc.name, implied, tc.wantImplied)
		}
	}
	other, _ := keyspace.Derive("images", keyspace.Scope{Tenant: "acme", User: "u2", Request: "r1"})
	if a, _ := storeKey(other.String(), "", ""); a == func() string { k, _ := storeKey(s, "", ""); return k }() {
		t.Errorf("two users share a compact key")
	}
}

func TestRecordRoundTrip(t *testing.T) {
	t.Parallel()
	fp := fingerprint.Fingerprint("v1:" + strings.Repeat("ab", 32))
	sums := []fingerprint.FieldSum{{1, 2, 3, 4}, {5, 6, 7, 8}}
	tok := idemgate.Token{9: 9}
	for _, tc := range []struct {
		name    string
		req     idemgate.ClaimRequest
		implied bool
		sums    []fingerprint.FieldSum
	}{
		{"raw, implied, sums", idemgate.ClaimRequest{Fingerprint: fp, Owner: "o", Kind: "k"}, true, sums},
		{"other fingerprint", idemgate.ClaimRequest{Fingerprint: "v1:x", Owner: "o", Kind: "k"}, false, nil},
		{"upper-case hex", idemgate.ClaimRequest{Fingerprint: fingerprint.Fingerprint(strings.ToUpper(string(fp))), Owner: "", Kind: "k"}, false, sums[:1]},
	} {
		id := newIdent(tc.req, tc.implied)
		b := appendClaim(nil, tok, &id, tc.sums)
		r, err := parseRecord(string(b))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if r.finished || r.token != string(tok[:]) || !r.sameFingerprint(&id, &tc.req, false) || !r.sameOwnerKind(&id, &tc.req, false) ||
			len(r.sums) != storedSum*len(tc.sums) || r.changed(tc.sums) != nil {
			t.Errorf("%s: parsed %+v", tc.name, r)
		}
		resp, _ := appendResponse(nil, idemgate.Response{Status: 200, Body: []byte("x")})
		fin := append([]byte{recordV2, 'F'}, append(b[2:], resp...)...)
		if r, err = parseRecord(string(fin)); err != nil || !r.finished || r.resp != string(resp) {
			t.Errorf("%s: finished record parsed %+v, %v", tc.name, r, err)
		}
		if _, err := parseRecord(string(b[:len(b)-1])); err == nil {
			t.Errorf("%s: a truncated claim parsed", tc.name)
		}
	}
}

// TestRecordV1: records the version 1 encoder wrote parse with their
// fingerprint, owner, kind and response.
func TestRecordV1(t *testing.T) {
	t.Parallel()
	req := idemgate.ClaimRequest{Fingerprint: "v1:" + fingerprint.Fingerprint(strings.Repeat("0", 64)), Owner: "owner-a", Kind: "image"}
	want := idemgate.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":1}`)}
	tok := idemgate.Token{1}
	r, err := parseRecord(string(v1Finished(tok, req, want)))
	if err != nil {
		t.Fatal(err)
	}
	if !r.finished || r.token != string(tok[:]) || !r.sameFingerprint(nil, &req, true) || !r.sameOwnerKind(nil, &req, true) {
		t.Fatalf("parsed %+v", r)
	}
	got, err := decodeResponse(r.resp)
	if err != nil {
		t.Fatal(err)
	}
	sameResponse(t, got, want)
	if r, err = parseRecord(string(v1Claim(tok, req))); err != nil || r.finished {
		t.Fatalf("claim parsed %+v, %v", r, err)
	}
}

// FuzzDecodeResponse: a corrupt response is an error, never a panic, and a
// decoded response encodes back to the same response (map order is not
// kept, so compare by decoding again).
func FuzzDecodeResponse(f *testing.F) {
	enc, _ := appendResponse(nil, idemgate.Response{Status: 201, Header: http.Header{"A": {"b", "c"}, "Content-Type": {"application/json"}}, Body: []byte("x")})
	f.Add(string(enc))
	f.Add(string(v1Response(nil, idemgate.Response{Status: 201, Header: http.Header{"A": {"b", "c"}}, Body: []byte("x")})))
	f.Add("\x01")
	f.Add("\x01\xc9\x01\x05")
	f.Add("\xc9\x01\x01\x01\x01\x01")
	f.Fuzz(func(t *testing.T, s string) {
		r, err := decodeResponse(s)
		if err != nil {
			return
		}
		enc, err := appendResponse(nil, r)
		if err != nil {
			if r.Status >= 100 && r.Status <= 999 {
				t.Fatalf("decoded response does not encode: %v", err)
			}
			return
		}
		again, err := decodeResponse(string(enc))
		if err != nil {
			t.Fatalf("re-encoding of a decoded response does not decode: %v", err)
		}
		if again.Status != r.Status || !bytes.Equal(again.Body, r.Body) || len(again.Header) != len(r.Header) {
			t.Fatalf("round trip changed %+v to %+v", r, again)
		}
	})
}

// FuzzParseRecord: any stored value parses or is an error, never a panic;
// a parsed record's parts lie within the value.
func FuzzParseRecord(f *testing.F) {
	id := newIdent(idemgate.ClaimRequest{Fingerprint: "v1:" + fingerprint.Fingerprint(strings.Repeat("ab", 32))}, true)
	claim := appendClaim(nil, idemgate.Token{1}, &id, []fingerprint.FieldSum{{1, 2, 3, 4}})
	f.Add(string(claim))
	resp, _ := appendResponse(nil, idemgate.Response{Status: 200, Body: []byte("ok")})
	f.Add(string(append(append([]byte{recordV2, 'F'}, claim[2:]...), resp...)))
	f.Add(string(v1Finished(idemgate.Token{2}, idemgate.ClaimRequest{Fingerprint: "v1:x", Owner: "o", Kind: "k"}, idemgate.Response{Status: 200})))
	f.Add(string(v1Claim(idemgate.Token{2}, idemgate.ClaimRequest{Fingerprint: "v1:x", Owner: "o", Kind: "k"})))
	f.Fuzz(func(t *testing.T, v string) {
		r, err := parseRecord(v)
		if err != nil {
			return
		}
		if len(r.token) != 16 || len(r.sums)%storedSum != 0 || (r.rawFP && len(r.fp) != storedFP) {
			t.Fatalf("parsed %+v from %q", r, v)
		}
		if r.finished != (r.resp != "") {
			t.Fatalf("finished %v with response %q", r.finished, r.resp)
		}
		_ = r.changed([]fingerprint.FieldSum{{1, 2, 3, 4}})
		if r.finished {
			_, _ = decodeResponse(r.resp)
		}
	})
}

// TestDecodeResponseRefusesStatusBelow100: a corrupt or planted version 1
// response frame with a status below 100 is refused like a version 2 one;
// replaying it would make net/http panic in WriteHeader.
func TestDecodeResponseRefusesStatusBelow100(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"\x01\x00\x00body", "\x01\x63\x00body"} {
		if r, err := decodeResponse(s); err == nil {
			t.Errorf("decodeResponse(%q) = status %d, nil; want an error", s, r.Status)
		}
	}
}

func newToken() idemgate.Token {
	var t idemgate.Token
	_, _ = rand.Read(t[:])
	return t
}
