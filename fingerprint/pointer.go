package fingerprint

import (
	"errors"
	"slices"
	"strconv"
	"strings"
)

// A token is one unescaped reference token of a JSON Pointer.
type token struct {
	name  string // matches an object member with this name
	index int    // matches this array element; -1 when name is not an array index
}

// A pointer is a compiled JSON Pointer: toks[first:first+n] of its program.
type pointer struct {
	first, n int
	field    int    // slot among the sorted, distinct Fields; -1 for an Exclude pointer
	src      string // the pointer as configured, for error messages
}

// A program is a Spec compiled for one pass over a body. It lives in the
// pooled state, so compiling allocates nothing unless a pointer holds '~'.
type program struct {
	toks   []token
	ptrs   []pointer
	fields []string // Spec.Fields sorted and without duplicates
	order  []int    // order[i] is the slot in fields of Spec.Fields[i]
	root   int      // field slot of the pointer "" (the whole body), or -1
}

func (p *program) reset() {
	clear(p.toks) // drop references to the last Spec's strings
	p.toks = p.toks[:0]
	clear(p.ptrs)
	p.ptrs = p.ptrs[:0]
	clear(p.fields)
	p.fields = p.fields[:0]
	p.order = p.order[:0]
	p.root = -1
}

// compile checks every pointer of s and prepares them for matching.
func (p *program) compile(s Spec) error {
	p.reset()
	p.fields = append(p.fields, s.Fields...)
	slices.Sort(p.fields)
	p.fields = slices.Compact(p.fields)
	for _, f := range s.Fields {
		slot, _ := slices.BinarySearch(p.fields, f)
		p.order = append(p.order, slot)
	}
	for slot, f := range p.fields {
		if f == "" {
			p.root = slot
			continue
		}
		if err := p.add(f, slot); err != nil {
			return invalidf("field %q: invalid JSON Pointer: %v", f, err)
		}
	}
	for _, x := range s.Exclude {
		if x == "" {
			return invalidf("exclude %q: the whole body cannot be excluded", x)
		}
		if err := p.add(x, -1); err != nil {
			return invalidf("exclude %q: invalid JSON Pointer: %v", x, err)
		}
	}
	return nil
}

func (p *program) add(ptr string, field int) error {
	first := len(p.toks)
	toks, err := appendTokens(p.toks, ptr)
	if err != nil {
		return err
	}
	p.toks = toks
	p.ptrs = append(p.ptrs, pointer{first: first, n: len(toks) - first, field: field, src: ptr})
	return nil
}

// appendTokens appends the reference tokens of the RFC 6901 JSON Pointer ptr.
func appendTokens(toks []token, ptr string) ([]token, error) {
	if ptr == "" {
		return toks, nil
	}
	if ptr[0] != '/' {
		return toks, errors.New("must be empty or start with '/'")
	}
	rest := ptr[1:]
	for {
		raw, next, more := strings.Cut(rest, "/")
		name, err := unescapeToken(raw)
		if err != nil {
			return toks, err
		}
		toks = append(toks, token{name: name, index: arrayIndex(name)})
		if !more {
			return toks, nil
		}
		rest = next
	}
}

var errTilde = errors.New("'~' not followed by '0' or '1'")

// unescapeToken turns "~1" into "/" and "~0" into "~", in one left-to-right
// pass so that "~01" becomes "~1" as RFC 6901 requires.
func unescapeToken(raw string) (string, error) {
	i := strings.IndexByte(raw, '~')
	if i < 0 {
		return raw, nil
	}
	var b strings.Builder
	b.Grow(len(raw))
	b.WriteString(raw[:i])
	for ; i < len(raw); i++ {
		c := raw[i]
		if c != '~' {
			b.WriteByte(c)
			continue
		}
		if i+1 == len(raw) {
			return "", errTilde
		}
		switch raw[i+1] {
		case '0':
			b.WriteByte('~')
		case '1':
			b.WriteByte('/')
		default:
			return "", errTilde
		}
		i++
	}
	return b.String(), nil
}

// arrayIndex returns the array index a token names, or -1. RFC 6901 allows
// no leading zeros, so "01" names only an object member.
func arrayIndex(s string) int {
	if s == "" || len(s) > 1 && s[0] == '0' {
		return -1
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return -1
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil { // too large to index any array a body can hold
		return -1
	}
	return n
}

// foldedError reports a member name or form field name at offset off that
// is not the name p selects or excludes but equal to it under case folding.
// The message names the pointer, which is configuration, and never the
// name found, which is body content.
func foldedError(p pointer, what string, off int) error {
	role := "selected"
	if p.field < 0 {
		role = "excluded"
	}
	return invalidf("%s at offset %d differs from the %s field %q only in case (a binder that folds names would read it as that field); send the name exactly", what, off, role, p.src)
}
