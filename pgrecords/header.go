package pgrecords

import (
	"encoding/binary"
	"errors"
	"net/http"
)

// A stored header is
//
//	uvarint(#names) { str(name) uvarint(#values) { str(value) } }
//
// where str(x) is uvarint(len(x)) x: every byte kept, in order.

var errCorrupt = errors.New("corrupt stored header")

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

// decodeHeader decodes a stored header; nil for none. The values of all
// names share one backing array.
func decodeHeader(b []byte) (http.Header, error) {
	d := reader{b: b}
	names := d.uvarint()
	if d.err || names > uint64(len(b)) {
		return nil, errCorrupt
	}
	start, total := d.i, 0
	for range names {
		d.str()
		n := d.uvarint()
		if d.err || n > uint64(len(b)) {
			return nil, errCorrupt
		}
		total += int(n)
		for range n {
			d.str()
		}
	}
	if d.err || d.i != len(b) {
		return nil, errCorrupt
	}
	if names == 0 {
		return nil, nil
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
	return h, nil
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
