package middleware

import (
	"encoding/binary"
	"errors"
	"net/http"

	"github.com/idemgate/idemgate/fingerprint"
)

// Records of the Redis store, version 2. A claimed record is
//
//	0x02 'C' token(16) flags fingerprint [owner kind] [sums]
//
// and a finished one the same with 'F' for 'C', followed by the response.
// The version byte comes first, so the next format is told apart by its
// first byte; version 1 records (below) start with 'C' or 'F'.
//
// flags says how the rest reads:
//
//	flagRawFP    fingerprint is the first 24 bytes (192 bits: finding two
//	             parameter sets that share them takes about 2^96 hashes)
//	             of the digest of a "v1:" fingerprint; otherwise
//	             str(fingerprint as given)
//	flagImplied  owner and kind are those the key names (a keyspace key),
//	             so they are not stored; otherwise str(owner) str(kind)
//	flagSums     uvarint(n) and n field digests follow, the first 2 bytes
//	             of each FieldSum (they only explain a conflict: one
//	             changed field in 65536 goes unnamed)
//
// where str(x) is uvarint(len(x)) x. The response is
//
//	uvarint(status) uvarint(#names)
//	  { name uvarint(#values) { value } }
//	body (the rest, byte for byte)
//
// where a name is uvarint(i) naming headerNames[i-1], or 0 and str(name);
// a value is the same with headerValues. The status (100–999) never
// encodes to the byte 0x01, which starts a version 1 response: a claim a
// version 1 node made and a version 2 node completed holds a version 2
// response in a version 1 frame, and it reads back.
const recordV2 = 0x02

const (
	flagRawFP = 1 << iota
	flagImplied
	flagSums
)

// The version 1 (idemgate ≤ v0.x) records: 'C' token(16) str(fingerprint)
// str(owner) str(kind) for a claim, 'F' and the same followed by the
// response for a finished one; its response is 0x01 uvarint(status)
// uvarint(#names) { str(name) uvarint(#values) { str(value) } } body.
const responseV1 = 0x01

// headerNames and headerValues are the names and values a response stores
// as one byte. Append only: a record written with index i must read back
// the same string for as long as version 2 records live.
var (
	headerNames = [...]string{
		"Content-Type", "Location", "Retry-After", "Cache-Control", "Etag",
		"Content-Encoding", "Vary", "Last-Modified", "Link", "Content-Language",
		"Content-Disposition", "Expires", "Preference-Applied", "X-Request-Id",
	}
	headerValues = [...]string{
		"application/json", "application/json; charset=UTF-8", "application/json; charset=utf-8",
		"application/problem+json", "text/plain; charset=utf-8", "text/html; charset=utf-8",
		"application/octet-stream", "no-store", "no-cache", "private", "gzip", "br", "zstd",
		"Accept-Encoding", "1", "0",
	}
)

const (
	storedFP  = 24 // bytes of a raw fingerprint digest kept
	storedSum = 2  // bytes of a FieldSum kept
)

var errCorrupt = errors.New("corrupt stored record")

// ident is what a claim compares: the fingerprint, and the owner and kind
// unless the key already names them.
type ident struct {
	rawFP   bool
	raw     [32]byte // the digest, when rawFP
	fp      string   // the fingerprint as given, when !rawFP
	implied bool
	owner   string // when !implied
	kind    string
}

// newIdent returns the ident of req; implied reports that the key names
// req's owner and kind.
func newIdent(req ClaimRequest, implied bool) ident {
	id := ident{implied: implied}
	if f := string(req.Fingerprint); len(f) == 3+64 && f[:3] == "v1:" {
		if _, ok := appendLowerHex(id.raw[:0], f[3:]); ok {
			id.rawFP = true
		}
	}
	if !id.rawFP {
		id.fp = string(req.Fingerprint)
	}
	if !implied {
		id.owner, id.kind = req.Owner, req.Kind
	}
	return id
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if lowerHex[s[i]] > 0x0f {
			return false
		}
	}
	return true
}

// appendLowerHex appends the bytes that s, lowercase hex of even length,
// encodes; ok is false (and dst is not to be used) for any other s. One
// pass, where isLowerHex and hex.Decode are two.
func appendLowerHex(dst []byte, s string) (_ []byte, ok bool) {
	if len(s)%2 != 0 {
		return dst, false
	}
	for i := 0; i < len(s); i += 2 {
		hi, lo := lowerHex[s[i]], lowerHex[s[i+1]]
		if hi|lo > 0x0f {
			return dst, false
		}
		dst = append(dst, hi<<4|lo)
	}
	return dst, true
}

// lowerHex maps '0'–'9' and 'a'–'f' to their value, every other byte to 0xff.
var lowerHex = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for c := byte('0'); c <= '9'; c++ {
		t[c] = c - '0'
	}
	for c := byte('a'); c <= 'f'; c++ {
		t[c] = c - 'a' + 10
	}
	return t
}()

// appendClaim appends a version 2 claimed record.
func appendClaim(b []byte, tok Token, id *ident, sums []fingerprint.FieldSum) []byte {
	b = append(b, recordV2, 'C')
	b = append(b, tok[:]...)
	var flags byte
	if id.rawFP {
		flags |= flagRawFP
	}
	if id.implied {
		flags |= flagImplied
	}
	if len(sums) > 0 {
		flags |= flagSums
	}
	b = append(b, flags)
	if id.rawFP {
		b = append(b, id.raw[:storedFP]...)
	} else {
		b = appendString(b, id.fp)
	}
	if !id.implied {
		b = appendString(b, id.owner)
		b = appendString(b, id.kind)
	}
	if len(sums) > 0 {
		b = binary.AppendUvarint(b, uint64(len(sums)))
		for _, s := range sums {
			b = append(b, s[:storedSum]...)
		}
	}
	return b
}

// record is a stored record, parsed; its strings are substrings of the
// stored value.
type record struct {
	finished bool
	token    string // 16 bytes
	rawFP    bool   // v2: fp is a 32-byte digest
	fp       string
	implied  bool
	owner    string
	kind     string
	sums     string // storedSum bytes per FieldSum
	resp     string // the encoded response, when finished
}

// parseRecord parses a version 2 or version 1 record.
func parseRecord(v string) (record, error) {
	var r record
	if len(v) == 0 {
		return r, errCorrupt
	}
	if v[0] != recordV2 {
		return parseRecordV1(v)
	}
	if len(v) < 2+16+1 || (v[1] != 'C' && v[1] != 'F') {
		return r, errCorrupt
	}
	r.finished = v[1] == 'F'
	r.token = v[2:18]
	flags := v[18]
	if flags&^(flagRawFP|flagImplied|flagSums) != 0 {
		return r, errCorrupt
	}
	d := decoder{s: v, i: 19}
	if r.rawFP = flags&flagRawFP != 0; r.rawFP {
		r.fp = d.fixed(storedFP)
	} else {
		r.fp = d.str()
	}
	if r.implied = flags&flagImplied != 0; !r.implied {
		r.owner = d.str()
		r.kind = d.str()
	}
	if flags&flagSums != 0 {
		n := d.uvarint()
		if n == 0 || n > uint64(len(v)) {
			return r, errCorrupt
		}
		r.sums = d.fixed(storedSum * int(n))
	}
	if d.err || (!r.finished && d.i != len(v)) || (r.finished && d.i == len(v)) {
		return r, errCorrupt
	}
	r.resp = v[d.i:]
	return r, nil
}

func parseRecordV1(v string) (record, error) {
	var r record
	if len(v) < 17 || (v[0] != 'C' && v[0] != 'F') {
		return r, errCorrupt
	}
	r.finished = v[0] == 'F'
	r.token = v[1:17]
	d := decoder{s: v, i: 17}
	r.fp = d.str()
	r.owner = d.str()
	r.kind = d.str()
	if d.err || (!r.finished && d.i != len(v)) || (r.finished && d.i == len(v)) {
		return r, errCorrupt
	}
	r.resp = v[d.i:]
	return r, nil
}

// sameOwnerKind reports whether r was claimed for id's owner and kind.
func (r *record) sameOwnerKind(id *ident, req *ClaimRequest, v1 bool) bool {
	if v1 {
		return r.owner == req.Owner && r.kind == req.Kind
	}
	if r.implied || id.implied {
		return r.implied == id.implied
	}
	return r.owner == id.owner && r.kind == id.kind
}

// sameFingerprint reports whether r holds id's (or, v1, req's) fingerprint.
func (r *record) sameFingerprint(id *ident, req *ClaimRequest, v1 bool) bool {
	switch {
	case v1:
		return r.fp == string(req.Fingerprint)
	case r.rawFP != id.rawFP:
		return false
	case r.rawFP:
		return r.fp == string(id.raw[:storedFP])
	}
	return r.fp == id.fp
}

// changed returns the indexes of req.Fields whose sums r does not hold, or
// nil if r holds no sums or all of them.
func (r *record) changed(fields []fingerprint.FieldSum) []int {
	if len(r.sums) == 0 {
		return nil
	}
	var out []int
	for i, f := range fields {
		found := false
		for j := 0; j+storedSum <= len(r.sums); j += storedSum {
			if r.sums[j:j+storedSum] == string(f[:storedSum]) {
				found = true
				break
			}
		}
		if !found {
			out = append(out, i)
		}
	}
	return out
}

// appendResponse appends the version 2 encoding of resp.
func appendResponse(b []byte, resp Response) ([]byte, error) {
	if resp.Status < 100 || resp.Status > 999 {
		return b, errors.New("status out of range")
	}
	b = binary.AppendUvarint(b, uint64(resp.Status))
	b = binary.AppendUvarint(b, uint64(len(resp.Header)))
	for name, values := range resp.Header {
		b = appendIndexed(b, name, headerNames[:])
		b = binary.AppendUvarint(b, uint64(len(values)))
		for _, v := range values {
			b = appendIndexed(b, v, headerValues[:])
		}
	}
	return append(b, resp.Body...), nil
}

func appendIndexed(b []byte, s string, table []string) []byte {
	for i, t := range table {
		if t == s {
			return binary.AppendUvarint(b, uint64(i+1))
		}
	}
	b = append(b, 0)
	return appendString(b, s)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decodeResponse decodes an encoded response of either version. Header
// names and values are substrings of s or table entries, so decoding costs
// a map, one values slice and the body.
func decodeResponse(s string) (Response, error) {
	sr, err := checkResponse(s)
	if err != nil {
		return Response{}, err
	}
	return sr.response(), nil
}

// response decodes sr.
func (sr *storedResponse) response() Response {
	var header http.Header
	if sr.names > 0 {
		header = make(http.Header, sr.names)
	}
	sr.header(header, make([]string, sr.values))
	return Response{Status: sr.status, Header: header, Body: []byte(sr.s[sr.body:])}
}

// storedResponse is an encoded response that checkResponse accepted: what
// a replay from the Redis store writes without decoding it into a
// Response first.
type storedResponse struct {
	s      string
	v1     bool
	status int
	names  int // header entries
	values int // header values, all names together
	start  int // offset of the first header entry
	body   int // offset of the body
	// encoded: the last Content-Encoding entry has values, so that
	// decodeResponse's Header["Content-Encoding"] is not empty.
	encoded bool
}

// checkResponse checks the encoded response s of either version and
// measures it.
func checkResponse(s string) (storedResponse, error) {
	if len(s) == 0 {
		return storedResponse{}, errCorrupt
	}
	sr := storedResponse{s: s, v1: s[0] == responseV1}
	d := decoder{s: s}
	if sr.v1 {
		d.i = 1
	}
	status := d.uvarint()
	names := d.uvarint()
	if d.err || status < 100 || status > 999 || names > uint64(len(s)) {
		return storedResponse{}, errCorrupt
	}
	sr.status, sr.names, sr.start = int(status), int(names), d.i
	for range names {
		name := d.header(sr.v1, headerNames[:])
		n := d.uvarint()
		if d.err || n > uint64(len(s)) {
			return storedResponse{}, errCorrupt
		}
		if name == "Content-Encoding" {
			sr.encoded = n > 0
		}
		sr.values += int(n)
		for range n {
			d.header(sr.v1, headerValues[:])
		}
	}
	if d.err {
		return storedResponse{}, errCorrupt
	}
	sr.body = d.i
	return sr, nil
}

// header sets sr's header entries in h, in order (a later entry of a name
// replaces an earlier one); their values share all, which holds at least
// sr.values strings.
func (sr *storedResponse) header(h http.Header, all []string) {
	d := decoder{s: sr.s, i: sr.start}
	for range sr.names {
		name := d.header(sr.v1, headerNames[:])
		n := int(d.uvarint())
		for j := range n {
			all[j] = d.header(sr.v1, headerValues[:])
		}
		h[name], all = all[:n:n], all[n:]
	}
}

type decoder struct {
	s   string
	i   int
	err bool
}

func (d *decoder) uvarint() uint64 {
	var x uint64
	for shift := uint(0); shift < 64; shift += 7 {
		if d.i >= len(d.s) {
			d.err = true
			return 0
		}
		c := d.s[d.i]
		d.i++
		x |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return x
		}
	}
	d.err = true
	return 0
}

func (d *decoder) str() string {
	n := d.uvarint()
	if d.err || n > uint64(len(d.s)-d.i) {
		d.err = true
		return ""
	}
	v := d.s[d.i : d.i+int(n)]
	d.i += int(n)
	return v
}

func (d *decoder) fixed(n int) string {
	if d.err || n > len(d.s)-d.i {
		d.err = true
		return ""
	}
	v := d.s[d.i : d.i+n]
	d.i += n
	return v
}

// header reads a header name or value: str in version 1, in version 2 a
// table index or 0 and str.
func (d *decoder) header(v1 bool, table []string) string {
	if v1 {
		return d.str()
	}
	i := d.uvarint()
	switch {
	case d.err:
		return ""
	case i == 0:
		return d.str()
	case i > uint64(len(table)):
		d.err = true
		return ""
	}
	return table[i-1]
}
