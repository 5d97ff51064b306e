package fingerprint

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash"
	"net/http"
)

// ErrInvalid is wrapped by every error about input: a body that is not
// strict JSON (see Canonicalize), a form or multipart body that does not
// parse, a malformed Content-Type, or a malformed JSON Pointer in a Spec.
var ErrInvalid = errors.New("fingerprint: invalid input")

// A Fingerprint identifies a set of request parameters: "v1:" followed by
// the 64 lowercase hex digits of a SHA-256 digest. Compare fingerprints
// with ==.
type Fingerprint string

// A Spec says which parts of a request body take part in its fingerprint.
// The zero Spec takes the whole body.
//
// Pointers match member names exactly. Because encoding/json and echo's
// form binder also match names that differ only under case folding, a body
// with a member (on a pointer's path) or form field named like a Fields or
// Exclude pointer's token up to folding, but not exactly, is an error: the
// handler could read a value the fingerprint does not cover.
type Spec struct {
	// Fields lists the RFC 6901 JSON Pointers ("/prompt", "/size/0",
	// "/a~1b" for the member "a/b") whose values take part. A selected
	// field that is absent differs from one present with null, and "/0"
	// reached through an object member "0" differs from "/0" reached
	// through an array element. Empty means the whole body.
	Fields []string
	// Exclude lists JSON Pointers removed before anything is selected or
	// hashed: trace ids, client notes. An array index removes that element
	// of the array as received.
	Exclude []string
}

// Validate reports a malformed JSON Pointer in s, wrapping ErrInvalid. Call
// it when building the middleware: a bad pointer is a configuration error,
// not a per-request one.
func (s Spec) Validate() error {
	var p program
	return p.compile(s)
}

// Canonicalize returns the RFC 8785 (JSON Canonicalization Scheme) form of
// a JSON text: no insignificant whitespace, object members sorted by the
// UTF-16 code units of their names, strings with minimal escaping, numbers
// as IEEE-754 doubles written the way ECMAScript writes them.
//
// The input must be strict JSON: one value, valid UTF-8, no duplicate
// member names at any depth, no lone surrogate escapes, no number beyond
// the range of a double, nesting at most 512 deep. Anything else is an
// error wrapping ErrInvalid that names the problem and its byte offset.
func Canonicalize(json []byte) ([]byte, error) {
	st := getState()
	defer putState(st)
	st.out = st.out[:0]
	if err := st.scan(json, numbersDouble); err != nil {
		return nil, err
	}
	return st.canonical(make([]byte, 0, len(st.out)), 0), nil
}

// Sum returns the fingerprint of a JSON body, as SumRequest does for the
// media type application/json. Numbers are compared exactly (see the
// package documentation); the body must be acceptable to Canonicalize, or
// empty: an empty body (no bytes at all, as a POST /orders/1/cancel sends)
// is a request of its own, whatever the Spec, neither {} nor null.
func (s Spec) Sum(body []byte) (Fingerprint, error) {
	st := getState()
	defer putState(st)
	if err := st.own.compile(s); err != nil {
		return "", err
	}
	return st.sumBody(body)
}

func (st *state) sumBody(body []byte) (Fingerprint, error) {
	if len(body) == 0 {
		return st.sumEmpty(mediaJSON), nil
	}
	return st.sumJSON(mediaJSON, body)
}

// SumRequest returns the fingerprint of a request body by the media type of
// r's Content-Type (lower-cased), which takes part in the fingerprint:
//
//   - application/json and any */*+json: as Sum;
//   - application/x-www-form-urlencoded: every field, names sorted,
//     repeated values in order, less the fields named by single-token
//     Exclude pointers ("/client_note" names the field "client_note");
//     Fields do not narrow a form, as echo's form binder fills nested
//     structs from flat names that no pointer can tell;
//   - multipart/form-data: the same, each part with its headers
//     (normalized: a file under another file name or Content-Type differs)
//     and a file part by the SHA-256 of its bytes, whatever the boundary
//     and the order of differently named parts;
//   - anything else, a missing Content-Type included: the raw bytes and
//     the media type's parameters (normalized: names sorted, the charset
//     value lower-cased), so text/plain in UTF-8 and in Latin-1 differ.
//
// A request with a Content-Encoding header (gzip) is hashed as it is, with
// its coding and media type parameters, whatever its media type: a
// decompressing middleware inside the idempotency middleware hands the
// handler the decoded body, one outside it the fingerprint too, and the
// fingerprint cannot tell which; so it neither parses it nor honours Fields
// or Exclude (a false conflict at worst, never a false replay).
//
// The parameters of JSON and form media types do not take part: JSON is
// UTF-8 by definition, and form parsers ignore them. An empty body is the
// empty request for every media type, as echo's binder binds nothing from
// it. With Fields or Exclude, a JSON member or form field whose name is not
// a selected or excluded name but equal to one under case folding is an
// error (see the package documentation).
//
// body is the request body, already read; r.Body is not touched.
func (s Spec) SumRequest(r *http.Request, body []byte) (Fingerprint, error) {
	st := getState()
	defer putState(st)
	if err := st.own.compile(s); err != nil {
		return "", err
	}
	return st.sumRequest(r, body)
}

// A FieldSum is a short digest of one selected field as a fingerprint saw
// it: the pointer and the field's value, or its absence. Two requests whose
// fields share a FieldSum almost surely hold the same value there (a
// 32-bit digest: about one changed field in four billion looks unchanged);
// it tells a client which field it changed, never decides a replay.
type FieldSum [4]byte

// SumRequestFields is SumRequest that also appends to dst one FieldSum per
// pointer of s.Fields, in the order of s.Fields. It appends none when the
// fingerprint does not select fields one by one: no Fields, the pointer ""
// among them, an empty body, or a media type other than JSON and forms.
func (s Spec) SumRequestFields(r *http.Request, body []byte, dst []FieldSum) (Fingerprint, []FieldSum, error) {
	st := getState()
	defer putState(st)
	if err := st.own.compile(s); err != nil {
		return "", dst, err
	}
	return st.sumRequestFields(r, body, dst)
}

func (st *state) sumRequestFields(r *http.Request, body []byte, dst []FieldSum) (Fingerprint, []FieldSum, error) {
	fp, err := st.sumRequest(r, body)
	if err != nil || len(st.segs) != len(st.prog.fields) || len(st.segs) == 0 || st.prog.root >= 0 {
		return fp, dst, err
	}
	var buf [256]byte
	for _, slot := range st.prog.order {
		end := len(st.segBuf)
		if slot+1 < len(st.segs) {
			end = st.segs[slot+1]
		}
		in := append(append(buf[:0], fieldVersion...), st.segBuf[st.segs[slot]:end]...)
		sum := sha256.Sum256(in)
		dst = append(dst, FieldSum(sum[:4]))
	}
	return fp, dst, nil
}

// A Compiled is a Spec checked and prepared once, for a Spec that
// fingerprints many requests (a route's): its methods give the same
// results as the Spec's, without checking and preparing the pointers on
// every call. It is safe for concurrent use, and its Spec's later changes
// do not reach it.
type Compiled struct {
	prog program
}

// Compile checks s as Validate does and prepares it for matching.
func (s Spec) Compile() (*Compiled, error) {
	c := &Compiled{}
	if err := c.prog.compile(s); err != nil {
		return nil, err
	}
	return c, nil
}

// Sum is Spec.Sum of the compiled Spec.
func (c *Compiled) Sum(body []byte) (Fingerprint, error) {
	st := getState()
	defer putState(st)
	st.prog = &c.prog
	return st.sumBody(body)
}

// SumRequest is Spec.SumRequest of the compiled Spec.
func (c *Compiled) SumRequest(r *http.Request, body []byte) (Fingerprint, error) {
	st := getState()
	defer putState(st)
	st.prog = &c.prog
	return st.sumRequest(r, body)
}

// SumRequestFields is Spec.SumRequestFields of the compiled Spec.
func (c *Compiled) SumRequestFields(r *http.Request, body []byte, dst []FieldSum) (Fingerprint, []FieldSum, error) {
	st := getState()
	defer putState(st)
	st.prog = &c.prog
	return st.sumRequestFields(r, body, dst)
}

// fieldVersion starts the hash input of a FieldSum, followed by the
// field's part of the fingerprint input for JSON (str(pointer) and its
// value, see the kind 'S' below); for a form, which takes part whole, by
// str(pointer) and the field's values as the kind 'A' writes them (count
// 0 when absent).
const fieldVersion = "idemgate field v1\x00"

func (st *state) sumRequest(r *http.Request, body []byte) (Fingerprint, error) {
	mt, err := parseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		return "", err
	}
	switch ce := r.Header["Content-Encoding"]; {
	case len(body) == 0:
		return st.sumEmpty(mt.typ), nil
	case len(ce) > 0:
		// The body may reach the handler decoded (a decompressing
		// middleware after this one) or not, and the fingerprint cannot
		// tell which: parsing it as JSON or a form could make two
		// encodings that decode to different parameters read alike.
		// Hash it as it is, with its coding.
		st.out = appendHeader(st.out[:0], mt.typ, 'C')
		st.out = binary.AppendUvarint(st.out, uint64(len(ce)))
		for _, v := range ce {
			st.out = appendStr(st.out, v)
		}
		st.out = appendParams(st.out, mt)
		st.out = append(st.out, body...)
		return st.finish(st.out), nil
	case isJSON(mt.typ):
		return st.sumJSON(mt.typ, body)
	case mt.typ == "application/x-www-form-urlencoded":
		f, err := parseURLEncoded(body)
		if err != nil {
			return "", err
		}
		return st.sumForm(mt.typ, f)
	case mt.typ == "multipart/form-data":
		f, err := parseMultipart(body, mt.params["boundary"])
		if err != nil {
			return "", err
		}
		return st.sumForm(mt.typ, f)
	default:
		st.out = appendHeader(st.out[:0], mt.typ, 'R')
		st.out = appendParams(st.out, mt)
		st.out = append(st.out, body...)
		return st.finish(st.out), nil
	}
}

func (st *state) sumEmpty(mediaType string) Fingerprint {
	st.out = appendHeader(st.out[:0], mediaType, 'E')
	return st.finish(st.out)
}

const mediaJSON = "application/json"

// The hash input of version 1 is
//
//	"idemgate fingerprint v1" 0x00 str(media type) kind payload
//
// where str(x) is the uvarint length of x followed by x, and the media type
// is lower-cased without its parameters. The kind byte fixes how the
// payload reads, and every payload is prefix-free:
//
//	'E' empty body, any media type; nothing follows
//	'J' canonical body (RFC 8785, numbers exact); the rest of the input
//	'S' uvarint(n), then per selected pointer, sorted:
//	    str(pointer) then 0x00 (absent) or 0x01 str(path) str(canonical value)
//	    where path has one byte per reference token of the pointer, in
//	    order: 'o' if the token named a member of an object, 'a' if it
//	    named an element of an array (so "/0" of {"0":"x"} is not "/0"
//	    of ["x"]); the pointer "" has the empty path
//	'A' form: uvarint(n), then per name, sorted: str(name) values
//	    where values = uvarint(count) then per value
//	    't' str(headers) str(text) or 'f' str(headers) 32-byte SHA-256 of
//	    a file's bytes; headers is empty in a
//	    urlencoded form and in multipart the part's headers: uvarint(n),
//	    then per header name, sorted: str(name) uvarint(count) and per
//	    value 'm' str(media type) params for Content-Type and
//	    Content-Disposition, 'r' str(value as sent) for the others
//	'R' raw body: params, then the body; the rest of the input
//	'C' a body with a Content-Encoding, whatever its media type: uvarint(n)
//	    then str(value as sent) per Content-Encoding header line, params,
//	    then the body as received; the rest of the input
//
// where params = 'p' uvarint(n) then per parameter, sorted by name:
// str(name) str(value), the value of charset lower-cased; or 'x'
// str(parameter text as sent) when the parameters do not parse.
const version = "idemgate fingerprint v1\x00"

func appendHeader(b []byte, mediaType string, kind byte) []byte {
	b = append(b, version...)
	b = appendStr(b, mediaType)
	return append(b, kind)
}

func appendStr[T string | []byte](b []byte, s T) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func (st *state) sumJSON(mediaType string, body []byte) (Fingerprint, error) {
	if len(st.prog.fields) == 0 {
		st.out = appendHeader(st.out[:0], mediaType, 'J')
		header := len(st.out)
		if err := st.scan(body, numbersExact); err != nil {
			return "", err
		}
		if len(st.nodes) == 0 { // written in canonical order already
			return st.finish(st.out), nil
		}
		h := st.hash()
		h.Write(st.out[:header])
		st.stream = h
		st.tmp = st.canonical(st.tmp[:0], header)
		st.stream = nil
		h.Write(st.tmp)
		return fingerprintOf(h.Sum(st.sum[:0])), nil
	}
	st.out = st.out[:0]
	if err := st.scan(body, numbersExact); err != nil {
		return "", err
	}
	b := appendHeader(st.tmp[:0], mediaType, 'S')
	b = binary.AppendUvarint(b, uint64(len(st.prog.fields)))
	for slot, f := range st.prog.fields {
		st.segs = append(st.segs, len(b))
		b = appendStr(b, f)
		v := st.selVal[slot]
		if v.start < 0 {
			b = append(b, 0)
			continue
		}
		b = append(b, 1)
		b = appendStr(b, st.sel[v.path:v.start])
		b = appendStr(b, st.sel[v.start:v.end])
	}
	st.tmp = b
	st.segBuf = b
	return st.finish(b), nil
}

func (st *state) finish(input []byte) Fingerprint {
	sum := sha256.Sum256(input)
	return fingerprintOf(sum[:])
}

// fingerprintOf returns "v1:" and sum in lowercase hex.
func fingerprintOf(sum []byte) Fingerprint {
	var b [3 + 2*sha256.Size]byte
	copy(b[:], "v1:")
	hex.Encode(b[3:], sum)
	return Fingerprint(b[:])
}

// hash returns the state's SHA-256, reset.
func (st *state) hash() hash.Hash {
	if st.sha == nil {
		st.sha = sha256.New()
	}
	st.sha.Reset()
	return st.sha
}
