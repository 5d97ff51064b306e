package fingerprint

import (
	"fmt"
	"hash"
	"hash/maphash"
	"math"
	"sync"
)

// maxDepth is the deepest nesting of arrays and objects a body may have.
const maxDepth = 512

// numberMode chooses how numbers are written.
type numberMode uint8

const (
	numbersDouble numberMode = iota // RFC 8785: IEEE-754 doubles in ES6 form
	numbersExact                    // decimal, exact: see appendExact
)

// An invalidError is an error about input. It wraps ErrInvalid without
// repeating its text.
type invalidError struct{ msg string }

func (e *invalidError) Error() string { return e.msg }
func (e *invalidError) Unwrap() error { return ErrInvalid }

func invalidf(format string, args ...any) error {
	return &invalidError{msg: fmt.Sprintf("fingerprint: "+format, args...)}
}

// A member is one member of an object being scanned.
type member struct {
	key        uint64 // sortKey of the name
	nameOff    int    // the decoded name: in the input, or in state.names when escaped
	start, end int    // the member's bytes in state.out; start < 0 when not written
	nodes      int    // state.nodes[nodes:nodesEnd] lie inside the member
	nodesEnd   int
	nameLen    int32 // member names longer than 2 GiB are not supported
	escaped    bool
}

// A placed member is where a written member of a node lies: what emitRange
// needs of a member, kept small as a body may hold a member every 6 bytes.
type placed struct {
	start, end      int // the member's bytes in state.out
	nodes, nodesEnd int // state.nodes[nodes:nodesEnd] lie inside the member
}

// A node is an object written to state.out whose bytes there are not yet
// canonical: its members are out of order, or a descendant's are. Nodes
// are listed in the order their objects open; emitRange puts them right.
// Moving bytes only once, at the end, keeps the cost linear however deep
// the reordered objects nest.
type node struct {
	start, end int // the object in state.out, braces included
	first, n   int // its written members in canonical order: state.order[first:first+n]
	next       int // the first node after this one that is not its descendant
}

// span is a selected value in state.sel: its typed path at sel[path:start]
// and its canonical form at sel[start:end].
type span struct{ path, start, end int }

// Path kinds: what each reference token of a selected field stepped into.
const (
	kindMember  = 'o' // a member of an object
	kindElement = 'a' // an element of an array
)

// state is everything one pass needs. It is pooled: a pass allocates nothing
// once the buffers have grown to the size of the bodies seen.
type state struct {
	data []byte
	pos  int
	mode numberMode

	out     []byte   // the body's canonical tokens, objects' members in input order
	nodes   []node   // the objects of out whose members need reordering
	order   []placed // written members of the nodes, in canonical order
	tmp     []byte   // the canonical body assembled from out
	names   []byte   // decoded member names that held escapes
	members []member // members of the open objects, innermost last

	// stream, when set, has emitRange pass what it assembles on to it in
	// chunks, keeping the assembly buffer small and in cache.
	stream hash.Hash
	sha    hash.Hash // reused by Sum
	sum    [32]byte  // a digest, kept here so it need not be allocated

	folds   []byte    // fold keys of one object's names (see foldCollision)
	foldIdx []foldKey // their places in folds
	foldTab []int32   // open-addressing table over foldIdx: index+1, 0 empty
	seed    maphash.Seed
	seeded  bool

	prog   *program // the Spec being applied: own, or a Compiled's (read only)
	own    program  // compiled per call by Spec's methods
	active []int    // indexes into prog.ptrs still matching, per open level
	sel    []byte   // canonical values of selected fields
	selVal []span   // per field slot; start < 0 when absent
	kinds  []byte   // kinds[d-1]: kind of the open container at depth d, while pointers match

	// segs[slot] is where each selected field's part of the hash input
	// starts in segBuf, for SumRequestFields; empty unless the last sum
	// selected fields one by one.
	segs   []int
	segBuf []byte
}

var statePool = sync.Pool{New: func() any { return new(state) }}

// maxPooled bounds the bytes of each buffer kept for reuse, so one huge
// body does not pin its memory. It is well above the bodies the middleware
// accepts by default (1 MiB).
const maxPooled = 16 << 20

func getState() *state {
	s := statePool.Get().(*state)
	s.own.reset()
	s.prog = &s.own
	s.segs, s.segBuf = s.segs[:0], nil
	return s
}

func putState(s *state) {
	const maxMembers = maxPooled / 64 // about 64 bytes a member
	if cap(s.out) > maxPooled || cap(s.tmp) > maxPooled || cap(s.sel) > maxPooled || cap(s.names) > maxPooled ||
		cap(s.members) > maxMembers || cap(s.order) > maxMembers || cap(s.nodes) > maxMembers ||
		cap(s.folds) > maxPooled || cap(s.foldIdx) > maxMembers || cap(s.foldTab) > 4*maxMembers {
		return
	}
	s.data, s.prog = nil, nil
	statePool.Put(s)
}

// scan checks that data is one strict JSON text and writes its tokens
// after the bytes already in s.out; canonical then assembles them in
// canonical order. With a compiled program scan also applies exclusions
// and, when Fields are set, puts the canonical selected values in s.sel
// instead of writing the whole body.
func (s *state) scan(data []byte, mode numberMode) error {
	s.data, s.pos, s.mode = data, 0, mode
	s.members = s.members[:0]
	s.nodes = s.nodes[:0]
	s.order = s.order[:0]
	s.names = s.names[:0]
	s.active = s.active[:0]
	s.sel = s.sel[:0]
	s.selVal = s.selVal[:0]
	s.kinds = s.kinds[:0]
	for range s.prog.fields {
		s.selVal = append(s.selVal, span{-1, -1, -1})
	}
	for i, p := range s.prog.ptrs {
		if p.n > 0 {
			s.active = append(s.active, i)
		}
	}
	emit := len(s.prog.fields) == 0
	s.skipSpace()
	if err := s.child(0, emit, 0, len(s.active), s.prog.root); err != nil {
		return err
	}
	s.skipSpace()
	if s.pos != len(s.data) {
		return s.errorf("data after the top-level value")
	}
	return nil
}

// errorf reports that the body is not strict JSON, at the current offset.
func (s *state) errorf(format string, args ...any) error {
	return invalidAt(s.pos, format, args...)
}

func invalidAt(off int, format string, args ...any) error {
	return invalidf("invalid JSON: %s at offset %d", fmt.Sprintf(format, args...), off)
}

func (s *state) skipSpace() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\n', '\r', '\t':
			s.pos++
		default:
			return
		}
	}
}

// child scans the value at depth depth (0 for the top level). Pointers
// s.active[a0:a1] have matched the path so far and go deeper; slot is the
// field slot the value itself is selected by, or -1.
func (s *state) child(depth int, emit bool, a0, a1, slot int) error {
	if slot < 0 {
		return s.value(depth, emit, a0, a1)
	}
	start, nodes, order := len(s.out), len(s.nodes), len(s.order)
	if err := s.value(depth, true, a0, a1); err != nil {
		return err
	}
	// The typed path: one kind per token, from the containers the
	// pointer went through (set by object and array while it matched).
	p := len(s.sel)
	s.sel = append(s.sel, s.kinds[:depth]...)
	n := len(s.sel)
	s.sel = s.emitRange(s.sel, start, len(s.out), nodes, len(s.nodes))
	s.selVal[slot] = span{p, n, len(s.sel)}
	if !emit {
		// Nothing around this value is written: drop it from out.
		s.out, s.nodes, s.order = s.out[:start], s.nodes[:nodes], s.order[:order]
	}
	return nil
}

// canonical appends to dst the canonical form of the value written at
// s.out[start:].
func (s *state) canonical(dst []byte, start int) []byte {
	return s.emitRange(dst, start, len(s.out), 0, len(s.nodes))
}

// emitRange appends s.out[start:end] to dst, with the objects of
// s.nodes[first:last] inside it in canonical order.
func (s *state) emitRange(dst []byte, start, end, first, last int) []byte {
	for i := first; i < last; i = s.nodes[i].next {
		n := &s.nodes[i]
		dst = s.put(dst, s.out[start:n.start])
		dst = append(dst, '{')
		for k, m := range s.order[n.first : n.first+n.n] {
			if k > 0 {
				dst = append(dst, ',')
			}
			dst = s.emitRange(dst, m.start, m.end, m.nodes, m.nodesEnd)
		}
		dst = append(dst, '}')
		start = n.end
	}
	return s.put(dst, s.out[start:end])
}

// streamChunk is how much emitRange gathers before passing it to s.stream.
const streamChunk = 16 << 10

func (s *state) put(dst, p []byte) []byte {
	if s.stream == nil || len(dst)+len(p) <= streamChunk {
		return append(dst, p...)
	}
	s.stream.Write(dst)
	if len(p) > streamChunk {
		s.stream.Write(p)
		return dst[:0]
	}
	return append(dst[:0], p...)
}

func (s *state) value(depth int, emit bool, a0, a1 int) error {
	if s.pos >= len(s.data) {
		return s.errorf("unexpected end of input")
	}
	switch c := s.data[s.pos]; c {
	case '{':
		return s.object(depth+1, emit, a0, a1)
	case '[':
		return s.array(depth+1, emit, a0, a1)
	case '"':
		_, _, _, err := s.str(emit, false)
		return err
	case 't':
		return s.literal("true", emit)
	case 'f':
		return s.literal("false", emit)
	case 'n':
		return s.literal("null", emit)
	default:
		if c == '-' || '0' <= c && c <= '9' {
			return s.number(emit)
		}
		return s.errorf("want a value")
	}
}

func (s *state) literal(lit string, emit bool) error {
	if len(s.data)-s.pos < len(lit) || string(s.data[s.pos:s.pos+len(lit)]) != lit {
		return s.errorf("invalid literal, want %s", lit)
	}
	s.pos += len(lit)
	if emit {
		s.out = append(s.out, lit...)
	}
	return nil
}

// match narrows the pointers s.active[a0:a1] to those whose token at depth
// equals the member name (or the array index when index >= 0). It appends
// the ones that go deeper to s.active and reports whether one ends here as
// an exclusion, and the field slot of one that ends here as a field.
//
// A member name that is not equal to a pointer's token but equal to it
// under encoding/json's case folding (bytes.EqualFold: "Prompt", "PROMPT",
// "ſ" for "s", the Kelvin sign for "k") is refused: a binder that folds
// names would read that member while the fingerprint skips it. folded is
// the index in s.prog.ptrs of such a pointer, or -1.
func (s *state) match(a0, a1, depth int, name []byte, index int) (excluded bool, slot, folded int) {
	slot, folded = -1, -1
	for _, pi := range s.active[a0:a1] {
		p := s.prog.ptrs[pi]
		t := s.prog.toks[p.first+depth]
		if index >= 0 {
			if t.index != index {
				continue
			}
		} else if t.name != string(name) {
			if folded < 0 && equalFold(name, t.name) {
				folded = pi
			}
			continue
		}
		switch {
		case p.n > depth+1:
			s.active = append(s.active, pi)
		case p.field < 0:
			excluded = true
		default:
			slot = p.field
		}
	}
	return excluded, slot, folded
}

func (s *state) object(depth int, emit bool, a0, a1 int) error {
	if depth > maxDepth {
		return s.errorf("nesting deeper than %d", maxDepth)
	}
	open := s.pos
	s.pos++
	s.skipSpace()
	if s.pos < len(s.data) && s.data[s.pos] == '}' {
		s.pos++
		if emit {
			s.out = append(s.out, '{', '}')
		}
		return nil
	}
	self := len(s.nodes)
	if emit {
		s.nodes = append(s.nodes, node{start: len(s.out)})
		s.out = append(s.out, '{')
	}
	mbase, nbase := len(s.members), len(s.names)
	if a0 < a1 {
		s.kinds = append(s.kinds[:depth-1], kindMember)
	}
	written, foldable := 0, false
	for {
		if s.pos >= len(s.data) || s.data[s.pos] != '"' {
			return s.errorf("want a member name")
		}
		keyAt, mark := s.pos, len(s.out)
		if emit && written > 0 {
			s.out = append(s.out, ',')
		}
		mstart := len(s.out)
		off, n, esc, err := s.str(emit, true)
		if err != nil {
			return err
		}
		if n > math.MaxInt32 {
			return invalidAt(keyAt, "member name longer than 2 GiB")
		}
		s.skipSpace()
		if s.pos >= len(s.data) || s.data[s.pos] != ':' {
			return s.errorf("want ':' after a member name")
		}
		s.pos++
		s.skipSpace()
		if emit {
			s.out = append(s.out, ':')
		}

		name := s.data[off : off+n]
		if esc {
			name = s.names[off : off+n]
		}
		c0 := len(s.active)
		excluded, slot := false, -1
		if a0 < a1 {
			var folded int
			excluded, slot, folded = s.match(a0, a1, depth-1, name, -1)
			if folded >= 0 {
				s.active = s.active[:c0]
				return foldedError(s.prog.ptrs[folded], "member name", keyAt)
			}
		}
		if emit && s.mode == numbersExact && !foldable {
			foldable = mayFold(name)
		}
		m := member{key: sortKey(name), nameOff: off, nameLen: int32(n), escaped: esc, start: -1}
		if excluded {
			s.out = s.out[:mark]
			err = s.value(depth, false, c0, c0)
		} else {
			m.nodes = len(s.nodes)
			err = s.child(depth, emit, c0, len(s.active), slot)
			if emit {
				m.start, m.end, m.nodesEnd = mstart, len(s.out), len(s.nodes)
				written++
			}
		}
		s.active = s.active[:c0]
		if err != nil {
			return err
		}
		s.members = append(s.members, m)

		more, err := s.separator('}', "an object")
		if err != nil {
			return err
		}
		if more {
			continue
		}
		break
	}
	ms := s.members[mbase:]
	reordered, err := s.orderMembers(ms, open, foldable)
	if err != nil {
		return err
	}
	if emit {
		s.out = append(s.out, '}')
		if reordered || len(s.nodes) > self+1 {
			n := &s.nodes[self]
			n.end, n.first, n.next = len(s.out), len(s.order), len(s.nodes)
			for _, m := range ms {
				if m.start >= 0 {
					s.order = append(s.order, placed{m.start, m.end, m.nodes, m.nodesEnd})
				}
			}
			n.n = len(s.order) - n.first
		} else {
			s.nodes = s.nodes[:self] // canonical as written
		}
	}
	s.members = s.members[:mbase]
	s.names = s.names[:nbase]
	return nil
}

func (s *state) array(depth int, emit bool, a0, a1 int) error {
	if depth > maxDepth {
		return s.errorf("nesting deeper than %d", maxDepth)
	}
	s.pos++
	if emit {
		s.out = append(s.out, '[')
	}
	s.skipSpace()
	if s.pos < len(s.data) && s.data[s.pos] == ']' {
		s.pos++
		if emit {
			s.out = append(s.out, ']')
		}
		return nil
	}
	if a0 < a1 {
		s.kinds = append(s.kinds[:depth-1], kindElement)
	}
	written := 0
	for index := 0; ; index++ {
		c0 := len(s.active)
		excluded, slot := false, -1
		if a0 < a1 {
			excluded, slot, _ = s.match(a0, a1, depth-1, nil, index)
		}
		var err error
		if excluded {
			err = s.value(depth, false, c0, c0)
		} else {
			if emit && written > 0 {
				s.out = append(s.out, ',')
			}
			err = s.child(depth, emit, c0, len(s.active), slot)
			written++
		}
		s.active = s.active[:c0]
		if err != nil {
			return err
		}
		more, err := s.separator(']', "an array")
		if err != nil {
			return err
		}
		if more {
			continue
		}
		break
	}
	if emit {
		s.out = append(s.out, ']')
	}
	return nil
}

// separator consumes what follows a member or element: ',' (more follows)
// or the container's closing byte. what names the container in errors.
func (s *state) separator(closing byte, what string) (more bool, err error) {
	s.skipSpace()
	if s.pos >= len(s.data) {
		return false, s.errorf("unexpected end of input in %s", what)
	}
	switch s.data[s.pos] {
	case ',':
		s.pos++
		s.skipSpace()
		return true, nil
	case closing:
		s.pos++
		return false, nil
	}
	return false, s.errorf("want ',' or '%c' in %s", closing, what)
}
