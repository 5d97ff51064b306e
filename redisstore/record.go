package redisstore

import (
	"encoding/binary"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/wire"
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

const (
	storedFP  = 24 // bytes of a raw fingerprint digest kept
	storedSum = 2  // bytes of a FieldSum kept
)

var errCorrupt = wire.ErrCorrupt

// responseV1 starts a version 1 response (internal/wire).
const responseV1 = wire.ResponseV1

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
func newIdent(req idemgate.ClaimRequest, implied bool) ident {
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
func appendClaim(b []byte, tok idemgate.Token, id *ident, sums []fingerprint.FieldSum) []byte {
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
		b = wire.AppendString(b, id.fp)
	}
	if !id.implied {
		b = wire.AppendString(b, id.owner)
		b = wire.AppendString(b, id.kind)
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
	d := wire.Decoder{S: v, I: 19}
	if r.rawFP = flags&flagRawFP != 0; r.rawFP {
		r.fp = d.Fixed(storedFP)
	} else {
		r.fp = d.Str()
	}
	if r.implied = flags&flagImplied != 0; !r.implied {
		r.owner = d.Str()
		r.kind = d.Str()
	}
	if flags&flagSums != 0 {
		n := d.Uvarint()
		if n == 0 || n > uint64(len(v)) {
			return r, errCorrupt
		}
		r.sums = d.Fixed(storedSum * int(n))
	}
	if d.Err || (!r.finished && d.I != len(v)) || (r.finished && d.I == len(v)) {
		return r, errCorrupt
	}
	r.resp = v[d.I:]
	return r, nil
}

func parseRecordV1(v string) (record, error) {
	var r record
	if len(v) < 17 || (v[0] != 'C' && v[0] != 'F') {
		return r, errCorrupt
	}
	r.finished = v[0] == 'F'
	r.token = v[1:17]
	d := wire.Decoder{S: v, I: 17}
	r.fp = d.Str()
	r.owner = d.Str()
	r.kind = d.Str()
	if d.Err || (!r.finished && d.I != len(v)) || (r.finished && d.I == len(v)) {
		return r, errCorrupt
	}
	r.resp = v[d.I:]
	return r, nil
}

// sameOwnerKind reports whether r was claimed for id's owner and kind.
func (r *record) sameOwnerKind(id *ident, req *idemgate.ClaimRequest, v1 bool) bool {
	if v1 {
		return r.owner == req.Owner && r.kind == req.Kind
	}
	if r.implied || id.implied {
		return r.implied == id.implied
	}
	return r.owner == id.owner && r.kind == id.kind
}

// sameFingerprint reports whether r holds id's (or, v1, req's) fingerprint.
func (r *record) sameFingerprint(id *ident, req *idemgate.ClaimRequest, v1 bool) bool {
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
func appendResponse(b []byte, resp idemgate.Response) ([]byte, error) {
	return wire.AppendResponse(b, resp.Status, resp.Header, resp.Body)
}

// decodeResponse decodes an encoded response of either version.
func decodeResponse(s string) (idemgate.Response, error) {
	status, header, body, err := wire.Decode(s)
	return idemgate.Response{Status: status, Header: header, Body: body}, err
}

// checkResponse checks the encoded response s of either version.
func checkResponse(s string) (wire.Stored, error) { return wire.Check(s) }

// response decodes a stored response.
func response(sr *wire.Stored) idemgate.Response {
	status, header, body := sr.Decode()
	return idemgate.Response{Status: status, Header: header, Body: body}
}
