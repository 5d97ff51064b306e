package fingerprint

import (
	"bytes"
	"encoding/binary"
	"hash/maphash"
	"slices"
	"unicode/utf8"
)

// name is the decoded member name of m: in s.names when it held escapes,
// else in s.data.
func (s *state) name(m *member) []byte {
	if m.escaped {
		return s.names[m.nameOff : m.nameOff+int(m.nameLen)]
	}
	return s.data[m.nameOff : m.nameOff+int(m.nameLen)]
}

func (s *state) compare(a, b *member) int {
	if a.key != b.key {
		if a.key < b.key {
			return -1
		}
		return 1
	}
	return compareUTF16(s.name(a), s.name(b))
}

// mayFold reports whether name could fold onto another name without being
// equal to it: only a name holding an upper-case ASCII letter or a byte
// beyond ASCII can (two names of lower-case ASCII fold together only when
// equal), so most objects skip foldCollision.
func mayFold(name []byte) bool {
	for _, c := range name {
		if c-'A' < 26 || c >= utf8.RuneSelf {
			return true
		}
	}
	return false
}

// orderMembers puts the members of one object in canonical order and
// rejects a repeated name; it reports whether the order changed. When two
// names fold together ("prompt" and "Prompt"; foldable says whether any
// name could), the object keeps its order as received instead:
// encoding/json binds both to one struct field and the last one wins, so
// their order is a parameter. That costs a reordered retry a false
// conflict, never a false replay; and which names collide is in the
// canonical text, so a kept object never reads like a sorted one.
func (s *state) orderMembers(ms []member, open int, foldable bool) (reordered bool, err error) {
	if foldable && s.mode == numbersExact && len(ms) > 1 && s.foldCollision(ms) {
		if d := s.repeated(ms); d >= 0 {
			return false, s.duplicate(&ms[d], open)
		}
		return false, nil
	}
	return s.sortMembers(ms, open)
}

// repeated returns the index of the first member whose name repeats an
// earlier one's exactly, or -1, in time linear in the object.
func (s *state) repeated(ms []member) int {
	size := s.table(len(ms))
	for i := range ms {
		name := s.name(&ms[i])
		for h := maphash.Bytes(s.seed, name) & uint64(size-1); ; h = (h + 1) & uint64(size-1) {
			j := s.foldTab[h] - 1
			if j < 0 {
				s.foldTab[h] = int32(i) + 1
				break
			}
			if bytes.Equal(s.name(&ms[j]), name) {
				return i
			}
		}
	}
	return -1
}

// table readies s.foldTab, empty, for n entries and returns its size, a
// power of two at least twice n.
func (s *state) table(n int) int {
	if !s.seeded {
		s.seed, s.seeded = maphash.MakeSeed(), true
	}
	size := 8
	for size < 2*n {
		size *= 2
	}
	s.foldTab = slices.Grow(s.foldTab[:0], size)[:size]
	clear(s.foldTab)
	return size
}

// A foldKey is where one member name's fold key lies in state.folds.
type foldKey struct{ start, end int }

// foldCollision reports whether two members of one object have names
// equal under simple case folding but not byte for byte, the way
// encoding/json matches names to struct fields (bytes.EqualFold). Fold
// keys are built as encoding/json builds them (ASCII upper-cased, every
// other rune mapped to the smallest rune of its fold orbit) and looked up
// in an open-addressing table, so the check is linear in the object
// whatever its names; a seeded hash keeps crafted names from colliding on
// purpose, and every hash match is confirmed byte for byte.
func (s *state) foldCollision(ms []member) bool {
	if len(ms) <= 8 {
		// Few members: compare the fold keys pair by pair.
		s.folds, s.foldIdx = s.folds[:0], s.foldIdx[:0]
		for i := range ms {
			start := len(s.folds)
			s.folds = appendFoldKey(s.folds, s.name(&ms[i]))
			key := s.folds[start:]
			for j, k := range s.foldIdx {
				if bytes.Equal(s.folds[k.start:k.end], key) && !bytes.Equal(s.name(&ms[j]), s.name(&ms[i])) {
					return true
				}
			}
			s.foldIdx = append(s.foldIdx, foldKey{start, len(s.folds)})
		}
		return false
	}
	size := s.table(len(ms))
	s.folds, s.foldIdx = s.folds[:0], s.foldIdx[:0]
	for i := range ms {
		name := s.name(&ms[i])
		start := len(s.folds)
		s.folds = appendFoldKey(s.folds, name)
		key := s.folds[start:]
		s.foldIdx = append(s.foldIdx, foldKey{start, len(s.folds)})
		for h := maphash.Bytes(s.seed, key) & uint64(size-1); ; h = (h + 1) & uint64(size-1) {
			j := s.foldTab[h] - 1
			if j < 0 {
				s.foldTab[h] = int32(i) + 1
				break
			}
			k := s.foldIdx[j]
			if bytes.Equal(s.folds[k.start:k.end], key) {
				if !bytes.Equal(s.name(&ms[j]), name) {
					return true
				}
				break // an exact repeat: sortMembers refuses it
			}
		}
	}
	return false
}

// sortMembers orders the members of one object by their names in UTF-16
// code units and rejects a repeated name. It reports whether the order
// changed.
func (s *state) sortMembers(ms []member, open int) (reordered bool, err error) {
	sorted := true
	for i := 1; i < len(ms); i++ {
		if c := s.compare(&ms[i-1], &ms[i]); c >= 0 {
			sorted = false
			break
		}
	}
	if sorted {
		return false, nil
	}
	if len(ms) <= 12 {
		for i := 1; i < len(ms); i++ {
			x := ms[i]
			j := i
			for ; j > 0 && s.compare(&ms[j-1], &x) > 0; j-- {
				ms[j] = ms[j-1]
			}
			ms[j] = x
		}
	} else {
		slices.SortFunc(ms, func(a, b member) int { return s.compare(&a, &b) })
	}
	for i := 1; i < len(ms); i++ {
		if s.compare(&ms[i-1], &ms[i]) == 0 {
			return false, s.duplicate(&ms[i], open)
		}
	}
	return true, nil
}

// duplicate reports a repeated member name at m (or at the object's
// opening brace when m's name was escaped).
func (s *state) duplicate(m *member, open int) error {
	off := open
	if !m.escaped {
		off = m.nameOff - 1
	}
	return invalidAt(off, "duplicate member name")
}

// compareUTF16 compares two valid UTF-8 strings by their UTF-16 code units.
func compareUTF16(a, b []byte) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return int(utf16Byte[a[i]]) - int(utf16Byte[b[i]])
		}
	}
	return len(a) - len(b)
}

// utf16Byte maps the bytes of valid UTF-8 so that byte order becomes the
// order of UTF-16 code units, the order RFC 8785 sorts member names in.
// The two orders differ only where U+E000..U+FFFF (lead bytes 0xEE, 0xEF)
// meets a character beyond U+FFFF (lead bytes 0xF0..0xF4, a surrogate pair
// in UTF-16), and lead bytes never occur as continuation bytes; so mapping
// 0xEE and 0xEF above 0xF4 is enough.
var utf16Byte = func() (t [256]byte) {
	for i := range t {
		t[i] = byte(i)
	}
	t[0xEE], t[0xEF] = 0xF5, 0xF6
	return t
}()

// sortKey packs the first 8 bytes of a name, mapped by utf16Byte, so that
// most comparisons of member names are one integer comparison. Equal keys
// say nothing (the name may be longer, or hold zero bytes): compare the
// names then.
func sortKey(name []byte) uint64 {
	var k uint64
	if len(name) >= 8 {
		k = binary.BigEndian.Uint64(name)
	} else {
		for i, c := range name {
			k |= uint64(c) << (56 - 8*i)
		}
	}
	if k&0x8080808080808080 == 0 { // ASCII: nothing to map
		return k
	}
	var m uint64
	for i := 56; i >= 0; i -= 8 {
		m |= uint64(utf16Byte[byte(k>>i)]) << i
	}
	return m
}
