package pgrecords

import (
	"encoding/binary"
	"errors"
	"net/http"
	"slices"

	"github.com/idemgate/idemgate"
)

// A record's ident is the claiming request's
//
//	str(owner) str(kind) fingerprint
//
// and its response
//
//	uint16(status) header body
//
// with the status big-endian, the body the rest, and the header
//
//	uvarint(#names) { str(name) uvarint(#values) { str(value) } }
//
// where str(x) is uvarint(len(x)) x: every byte kept, in order.

var errCorrupt = errors.New("corrupt stored response")

// appendIdent appends the ident of a claim by owner and kind with
// fingerprint fp.
func appendIdent(b []byte, owner, kind, fp string) []byte {
	b = slices.Grow(b, uvarintLen(len(owner))+len(owner)+uvarintLen(len(kind))+len(kind)+len(fp))
	b = appendStr(b, owner)
	b = appendStr(b, kind)
	return append(b, fp...)
}

// sameScope reports whether the ident held has the owner and kind of
// mine, an ident whose fingerprint is fpLen bytes long. Strings are
// length-prefixed, so an equal prefix is an equal owner and kind.
func sameScope(held, mine []byte, fpLen int) bool {
	n := len(mine) - fpLen
	return len(held) >= n && string(held[:n]) == string(mine[:n])
}

// appendResponse appends r as stored; its status must fit in 16 bits.
func appendResponse(b []byte, r idemgate.Response) []byte {
	b = slices.Grow(b, responseLen(r))
	b = binary.BigEndian.AppendUint16(b, uint16(r.Status))
	b = appendHeader(b, r.Header)
	return append(b, r.Body...)
}

// responseLen is the length of r as stored.
func responseLen(r idemgate.Response) int {
	n := 2 + uvarintLen(len(r.Header)) + len(r.Body)
	for name, values := range r.Header {
		n += uvarintLen(len(name)) + len(name) + uvarintLen(len(values))
		for _, v := range values {
			n += uvarintLen(len(v)) + len(v)
		}
	}
	return n
}

func uvarintLen(n int) int {
	l := 1
	for ; n >= 0x80; n >>= 7 {
		l++
	}
	return l
}

// decodeResponse decodes a stored response, which keeps b: the body
// aliases it. The header's names and values are substrings of one copy of
// the stored header, its values slices of one backing array.
func decodeResponse(b []byte) (idemgate.Response, error) {
	if len(b) < 2 {
		return idemgate.Response{}, errCorrupt
	}
	status := int(binary.BigEndian.Uint16(b))
	if status < 100 || status > 999 {
		return idemgate.Response{}, errCorrupt
	}
	h, n, err := readHeader(b[2:])
	if err != nil {
		return idemgate.Response{}, err
	}
	return idemgate.Response{Status: status, Header: h, Body: b[2+n:]}, nil
}

func appendHeader(b []byte, h http.Header) []byte {
	b = binary.AppendUvarint(b, uint64(len(h)))
	for name, values := range h {
		b = appendStr(b, name)
		b = binary.AppendUvarint(b, uint64(len(values)))
		for _, v := range values {
			b = appendStr(b, v)
		}
	}
	return b
}

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// readHeader decodes the stored header at the start of b and returns it
// (nil for none) with its length. It allocates the map, one string (the
// stored header, of which every name and value is a substring) and one
// slice that holds the values of all names.
func readHeader(b []byte) (http.Header, int, error) {
	d := reader{b: b}
	names := d.uvarint()
	if d.err || names > uint64(len(b)) {
		return nil, 0, errCorrupt
	}
	start, total := d.i, 0
	for range names {
		d.str()
		n := d.uvarint()
		if d.err || n > uint64(len(b)) {
			return nil, 0, errCorrupt
		}
		total += int(n)
		for range n {
			d.str()
		}
	}
	if d.err {
		return nil, 0, errCorrupt
	}
	end := d.i
	if names == 0 {
		return nil, end, nil
	}
	// The second pass reads what the first checked.
	stored := string(b[start:end])
	sub := func(from, to int) string { return stored[from-start : to-start] }
	d.i = start
	h := make(http.Header, names)
	all := make([]string, total)
	for range names {
		name := sub(d.str())
		n := int(d.uvarint())
		for j := range n {
			all[j] = sub(d.str())
		}
		h[name], all = all[:n:n], all[n:]
	}
	return h, end, nil
}

type reader struct {
	b   []byte
	i   int
	err bool
}

func (d *reader) uvarint() uint64 {
	if d.err {
		return 0
	}
	x, n := binary.Uvarint(d.b[d.i:])
	if n <= 0 {
		d.err = true
		return 0
	}
	d.i += n
	return x
}

// str reads a length-prefixed string and returns where its bytes start
// and end in b.
func (d *reader) str() (from, to int) {
	n := d.uvarint()
	if d.err || n > uint64(len(d.b)-d.i) {
		d.err = true
		return d.i, d.i
	}
	from = d.i
	d.i += int(n)
	return from, d.i
}
