// Package wire is the encoding of a stored response that the Redis
// store keeps and the engine replays without decoding (docs/records.md):
//
//	uvarint(status) uvarint(#names)
//	  { name uvarint(#values) { value } }
//	body (the rest, byte for byte)
//
// where a name is uvarint(i) naming HeaderNames[i-1], or 0 and str(name);
// a value is the same with HeaderValues, and str(x) is uvarint(len(x)) x.
// It imports nothing of idemgate, so that both the engine and the stores
// can.
package wire

import (
	"encoding/binary"
	"errors"
	"net/http"
)

// ErrCorrupt reports a stored value that does not parse.
var ErrCorrupt = errors.New("corrupt stored record")

// The version 1 (idemgate ≤ v0.x) records: 'C' token(16) str(fingerprint)
// str(owner) str(kind) for a claim, 'F' and the same followed by the
// response for a finished one; its response is 0x01 uvarint(status)
// uvarint(#names) { str(name) uvarint(#values) { str(value) } } body.
const ResponseV1 = 0x01

// HeaderNames and HeaderValues are the names and values a response stores
// as one byte. Append only: a record written with index i must read back
// the same string for as long as version 2 records live.
var (
	HeaderNames = [...]string{
		"Content-Type", "Location", "Retry-After", "Cache-Control", "Etag",
		"Content-Encoding", "Vary", "Last-Modified", "Link", "Content-Language",
		"Content-Disposition", "Expires", "Preference-Applied", "X-Request-Id",
	}
	HeaderValues = [...]string{
		"application/json", "application/json; charset=UTF-8", "application/json; charset=utf-8",
		"application/problem+json", "text/plain; charset=utf-8", "text/html; charset=utf-8",
		"application/octet-stream", "no-store", "no-cache", "private", "gzip", "br", "zstd",
		"Accept-Encoding", "1", "0",
	}
)

// AppendResponse appends the version 2 encoding of a response.
func AppendResponse(b []byte, status int, header http.Header, body []byte) ([]byte, error) {
	if status < 100 || status > 999 {
		return b, errors.New("status out of range")
	}
	b = binary.AppendUvarint(b, uint64(status))
	b = binary.AppendUvarint(b, uint64(len(header)))
	for name, values := range header {
		b = AppendIndexed(b, name, HeaderNames[:])
		b = binary.AppendUvarint(b, uint64(len(values)))
		for _, v := range values {
			b = AppendIndexed(b, v, HeaderValues[:])
		}
	}
	return append(b, body...), nil
}

func AppendIndexed(b []byte, s string, table []string) []byte {
	for i, t := range table {
		if t == s {
			return binary.AppendUvarint(b, uint64(i+1))
		}
	}
	b = append(b, 0)
	return AppendString(b, s)
}

// AppendString appends str(s).
func AppendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Decode decodes an encoded response of either version. Header names and
// values are substrings of s or table entries, so decoding costs a map,
// one values slice and the body.
func Decode(s string) (status int, header http.Header, body []byte, err error) {
	sr, err := Check(s)
	if err != nil {
		return 0, nil, nil, err
	}
	status, header, body = sr.Decode()
	return status, header, body, nil
}

// Decode decodes sr.
func (sr *Stored) Decode() (status int, header http.Header, body []byte) {
	if sr.names > 0 {
		header = make(http.Header, sr.names)
	}
	sr.SetHeader(header, make([]string, sr.values))
	return sr.status, header, []byte(sr.s[sr.body:])
}

// Status is the response's status.
func (sr *Stored) Status() int { return sr.status }

// Values is the number of header values, all names together: what
// SetHeader's all must hold.
func (sr *Stored) Values() int { return sr.values }

// Encoded reports whether the response has a Content-Encoding with values.
func (sr *Stored) Encoded() bool { return sr.encoded }

// Body is the response's body, a substring of the stored value.
func (sr *Stored) Body() string { return sr.s[sr.body:] }

// Stored is an encoded response that Check accepted: what a replay from
// the Redis store writes without decoding it first.
type Stored struct {
	s      string
	v1     bool
	status int
	names  int // header entries
	values int // header values, all names together
	start  int // offset of the first header entry
	body   int // offset of the body
	// encoded: the last Content-Encoding entry has values, so that
	// Decode's header["Content-Encoding"] is not empty.
	encoded bool
}

// Check checks the encoded response s of either version and
// measures it.
func Check(s string) (Stored, error) {
	if len(s) == 0 {
		return Stored{}, ErrCorrupt
	}
	sr := Stored{s: s, v1: s[0] == ResponseV1}
	d := Decoder{S: s}
	if sr.v1 {
		d.I = 1
	}
	status := d.Uvarint()
	names := d.Uvarint()
	if d.Err || status < 100 || status > 999 || names > uint64(len(s)) {
		return Stored{}, ErrCorrupt
	}
	sr.status, sr.names, sr.start = int(status), int(names), d.I
	for range names {
		name := d.Header(sr.v1, HeaderNames[:])
		n := d.Uvarint()
		if d.Err || n > uint64(len(s)) {
			return Stored{}, ErrCorrupt
		}
		if name == "Content-Encoding" {
			sr.encoded = n > 0
		}
		sr.values += int(n)
		for range n {
			d.Header(sr.v1, HeaderValues[:])
		}
	}
	if d.Err {
		return Stored{}, ErrCorrupt
	}
	sr.body = d.I
	return sr, nil
}

// SetHeader sets sr's header entries in h, in order (a later entry of a name
// replaces an earlier one); their values share all, which holds at least
// sr.values strings.
func (sr *Stored) SetHeader(h http.Header, all []string) {
	d := Decoder{S: sr.s, I: sr.start}
	for range sr.names {
		name := d.Header(sr.v1, HeaderNames[:])
		n := int(d.Uvarint())
		for j := range n {
			all[j] = d.Header(sr.v1, HeaderValues[:])
		}
		h[name], all = all[:n:n], all[n:]
	}
}

// Decoder reads a stored value from its offset I; Err is set once a read
// ran past its end or met a malformed uvarint.
type Decoder struct {
	S   string
	I   int
	Err bool
}

// Uvarint reads a uvarint.
func (d *Decoder) Uvarint() uint64 {
	var x uint64
	for shift := uint(0); shift < 64; shift += 7 {
		if d.I >= len(d.S) {
			d.Err = true
			return 0
		}
		c := d.S[d.I]
		d.I++
		x |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return x
		}
	}
	d.Err = true
	return 0
}

// Str reads str(x).
func (d *Decoder) Str() string {
	n := d.Uvarint()
	if d.Err || n > uint64(len(d.S)-d.I) {
		d.Err = true
		return ""
	}
	v := d.S[d.I : d.I+int(n)]
	d.I += int(n)
	return v
}

// Fixed reads n bytes.
func (d *Decoder) Fixed(n int) string {
	if d.Err || n > len(d.S)-d.I {
		d.Err = true
		return ""
	}
	v := d.S[d.I : d.I+n]
	d.I += n
	return v
}

// header reads a header name or value: str in version 1, in version 2 a
// table index or 0 and str.
func (d *Decoder) Header(v1 bool, table []string) string {
	if v1 {
		return d.Str()
	}
	i := d.Uvarint()
	switch {
	case d.Err:
		return ""
	case i == 0:
		return d.Str()
	case i > uint64(len(table)):
		d.Err = true
		return ""
	}
	return table[i-1]
}
