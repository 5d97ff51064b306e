package fingerprint

import (
	"encoding/binary"
	"math/bits"
	"unicode/utf8"
)

// plain marks the bytes a string may hold as they are: printable ASCII
// other than '"' and '\\'.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// special marks with its high bit each of the 8 bytes of x (little
// endian) that is a control character, '"', '\\' or not ASCII. A lane may
// be marked wrongly only above a lane that is special, as subtraction
// borrows upwards; so the lowest mark is exact.
func special(x uint64) uint64 {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	return ((x - lo*0x20) | ((x ^ lo*'"') - lo) | ((x ^ lo*'\\') - lo) | x) & hi
}

// str scans the string at s.pos. When emit is set it writes the string's
// canonical form to s.out. It returns where the decoded contents are: in
// s.data, or in s.names when the string held escapes and key is set.
func (s *state) str(emit, key bool) (off, n int, escaped bool, err error) {
	data := s.data
	i := s.pos + 1
	for i < len(data) {
		if i+8 <= len(data) {
			m := special(binary.LittleEndian.Uint64(data[i:]))
			if m == 0 {
				i += 8
				continue
			}
			i += bits.TrailingZeros64(m) >> 3
		}
		c := data[i]
		if plain[c] {
			i++
			continue
		}
		switch {
		case c == '"':
			if emit {
				s.out = append(s.out, data[s.pos:i+1]...)
			}
			off, n = s.pos+1, i-s.pos-1
			s.pos = i + 1
			return off, n, false, nil
		case c == '\\':
			return s.escapedStr(i, emit, key)
		case c < 0x20:
			s.pos = i
			return 0, 0, false, s.errorf("control character in a string")
		default:
			r, size := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && size == 1 {
				s.pos = i
				return 0, 0, false, s.errorf("invalid UTF-8 in a string")
			}
			i += size
		}
	}
	s.pos = len(data)
	return 0, 0, false, s.errorf("unterminated string")
}

// escapedStr finishes a string whose first escape is at i: it decodes the
// string into s.names and writes its canonical form from there.
func (s *state) escapedStr(i int, emit, key bool) (off, n int, escaped bool, err error) {
	data := s.data
	off = len(s.names)
	s.names = append(s.names, data[s.pos+1:i]...)
	for i < len(data) {
		c := data[i]
		switch {
		case plain[c]:
			start := i
			for i < len(data) && plain[data[i]] {
				i++
			}
			s.names = append(s.names, data[start:i]...)
		case c == '"':
			s.pos = i + 1
			n = len(s.names) - off
			if emit {
				s.out = appendQuoted(s.out, s.names[off:])
			}
			if !key {
				s.names = s.names[:off]
			}
			return off, n, true, nil
		case c == '\\':
			s.pos = i
			if i+1 >= len(data) {
				return 0, 0, false, s.errorf("unterminated string")
			}
			i += 2
			switch e := data[i-1]; e {
			case '"', '\\', '/':
				s.names = append(s.names, e)
			case 'b':
				s.names = append(s.names, '\b')
			case 'f':
				s.names = append(s.names, '\f')
			case 'n':
				s.names = append(s.names, '\n')
			case 'r':
				s.names = append(s.names, '\r')
			case 't':
				s.names = append(s.names, '\t')
			case 'u':
				r, ok := hex4(data[i:])
				if !ok {
					return 0, 0, false, s.errorf("invalid \\u escape")
				}
				i += 4
				if 0xDC00 <= r && r <= 0xDFFF {
					return 0, 0, false, s.errorf("lone surrogate escape")
				}
				if 0xD800 <= r && r <= 0xDBFF {
					lo, ok := rune(0), false
					if len(data)-i >= 6 && data[i] == '\\' && data[i+1] == 'u' {
						lo, ok = hex4(data[i+2:])
					}
					if !ok || lo < 0xDC00 || lo > 0xDFFF {
						return 0, 0, false, s.errorf("lone surrogate escape")
					}
					i += 6
					r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
				}
				s.names = utf8.AppendRune(s.names, r)
			default:
				return 0, 0, false, s.errorf("invalid escape")
			}
		case c < 0x20:
			s.pos = i
			return 0, 0, false, s.errorf("control character in a string")
		default:
			r, size := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && size == 1 {
				s.pos = i
				return 0, 0, false, s.errorf("invalid UTF-8 in a string")
			}
			s.names = append(s.names, data[i:i+size]...)
			i += size
		}
	}
	s.pos = len(data)
	return 0, 0, false, s.errorf("unterminated string")
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// appendQuoted writes the RFC 8785 form of the valid UTF-8 string v: only
// '"', '\\' and control characters are escaped, with the short escapes where
// JSON has them and lowercase \u00xx otherwise.
func appendQuoted(b, v []byte) []byte {
	const hexdig = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i, c := range v {
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, v[start:i]...)
		start = i + 1
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\b':
			b = append(b, '\\', 'b')
		case '\f':
			b = append(b, '\\', 'f')
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hexdig[c>>4], hexdig[c&0xf])
		}
	}
	b = append(b, v[start:]...)
	return append(b, '"')
}
