package pgrecords

import (
	"encoding/binary"
	"errors"
	"net/http"

	"github.com/idemgate/idemgate/middleware"
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
func appendResponse(b []byte, r middleware.Response) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(r.Status))
	b = appendHeader(b, r.Header)
	return append(b, r.Body...)
}

// decodeResponse decodes a stored response. The body aliases b; the
// header's values share one backing array.
func decodeResponse(b []byte) (middleware.Response, error) {
	if len(b) < 2 {
		return middleware.Response{}, errCorrupt
	}
	status := int(binary.BigEndian.Uint16(b))
	if status < 100 || status > 999 {
		return middleware.Response{}, errCorrupt
	}
	h, n, err := readHeader(b[2:])
	if err != nil {
		return middleware.Response{}, err
	}
	return middleware.Response{Status: status, Header: h, Body: b[2+n:]}, nil
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
// (nil for none) with its length. The values of all names share one
// backing array.
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
	d.i = start
	h := make(http.Header, names)
	all := make([]string, total)
	for range names {
		name := d.str()
		n := int(d.uvarint())
		for j := range n {
			all[j] = d.str()
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

func (d *reader) str() string {
	n := d.uvarint()
	if d.err || n > uint64(len(d.b)-d.i) {
		d.err = true
		return ""
	}
	s := string(d.b[d.i : d.i+int(n)])
	d.i += int(n)
	return s
}
