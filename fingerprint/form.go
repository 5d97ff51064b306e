package fingerprint

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/textproto"
	"slices"
	"strings"
)

// A mediaType is a parsed Content-Type: the lower-cased type and subtype,
// and its parameters as mime.ParseMediaType reads them (names lower-cased,
// quoting and RFC 2231 continuations undone). When the parameters do not
// parse, bad is set and raw holds the text after the first ';' as sent.
type mediaType struct {
	typ    string
	params map[string]string
	bad    bool
	raw    string
}

// parseMediaType parses a Content-Type. An empty Content-Type has the empty
// media type. The error never quotes the header.
func parseMediaType(ct string) (mediaType, error) {
	if strings.TrimSpace(ct) == "" {
		return mediaType{}, nil
	}
	if isPlainMediaType(ct) {
		return mediaType{typ: ct}, nil
	}
	typ, params, err := mime.ParseMediaType(ct)
	if err != nil && !errors.Is(err, mime.ErrInvalidMediaParameter) {
		return mediaType{}, invalidf("malformed media type: %v", err)
	}
	mt := mediaType{typ: typ, params: params}
	if err != nil {
		_, raw, _ := strings.Cut(ct, ";")
		mt.bad, mt.raw, mt.params = true, strings.TrimSpace(raw), nil
	}
	return mt, nil
}

// isPlainMediaType reports whether ct is type/subtype in lower case with
// nothing around it, such as application/json: what mime.ParseMediaType
// returns unchanged with no parameters, read here without its map.
func isPlainMediaType(ct string) bool {
	slash := -1
	for i := 0; i < len(ct); i++ {
		c := ct[i]
		switch {
		case c == '/' && slash < 0 && i > 0:
			slash = i
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return slash > 0 && slash < len(ct)-1
}

// appendParams appends the parameters of mt, normalized: 'p', the count,
// then each name and value sorted by name, with the value of charset
// lower-cased (charset names are case-insensitive) and every other value
// as sent; or 'x' and the parameter text as sent when it does not parse,
// so that it still takes part.
func appendParams(b []byte, mt mediaType) []byte {
	if mt.bad {
		b = append(b, 'x')
		return appendStr(b, mt.raw)
	}
	b = append(b, 'p')
	b = binary.AppendUvarint(b, uint64(len(mt.params)))
	names := make([]string, 0, len(mt.params))
	for k := range mt.params {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		v := mt.params[k]
		if k == "charset" {
			v = strings.ToLower(v)
		}
		b = appendStr(b, k)
		b = appendStr(b, v)
	}
	return b
}

func isJSON(mt string) bool {
	return mt == mediaJSON || strings.HasSuffix(mt, "+json") && strings.IndexByte(mt, '/') > 0
}

// A formValue is one value of a form field: text, or a file by its
// digest. A multipart value also carries its part's headers, normalized.
type formValue struct {
	file    bool
	text    string
	digest  [sha256.Size]byte
	headers []byte
}

// A formField is every value sent under one name, in order, and the byte
// offset of its first occurrence (for error messages).
type formField struct {
	off    int
	values []formValue
}

type form map[string]*formField

func (f form) add(name string, off int, v formValue) {
	ff := f[name]
	if ff == nil {
		ff = &formField{off: off}
		f[name] = ff
	}
	ff.values = append(ff.values, v)
}

// parseURLEncoded reads an application/x-www-form-urlencoded body as
// net/http's ParseForm does (url.ParseQuery): pairs split at '&', name and
// value at the first '=', '+' is a space, %XX a byte, empty pairs skipped.
// A pair holding ';' or a malformed %-escape makes ParseForm fail, and
// echo's binder with it; here it is an error naming the offset.
func parseURLEncoded(body []byte) (form, error) {
	f := make(form)
	for off := 0; off < len(body); {
		end := bytes.IndexByte(body[off:], '&')
		if end < 0 {
			end = len(body)
		} else {
			end += off
		}
		pair := body[off:end]
		if i := bytes.IndexByte(pair, ';'); i >= 0 {
			return nil, invalidf("form body: ';' at offset %d, want '&' between fields", off+i)
		}
		if len(pair) > 0 {
			name, value := pair, []byte(nil)
			if i := bytes.IndexByte(pair, '='); i >= 0 {
				name, value = pair[:i], pair[i+1:]
			}
			n, bad := unescapeQuery(name)
			if bad >= 0 {
				return nil, invalidf("form body: malformed %%-escape at offset %d", off+bad)
			}
			v, bad := unescapeQuery(value)
			if bad >= 0 {
				return nil, invalidf("form body: malformed %%-escape at offset %d", off+len(name)+1+bad)
			}
			f.add(n, off, formValue{text: v})
		}
		off = end + 1
	}
	return f, nil
}

// unescapeQuery undoes the escapes of a query component as
// url.QueryUnescape does. bad is the offset of a malformed escape, or -1.
func unescapeQuery(s []byte) (text string, bad int) {
	if bytes.IndexByte(s, '%') < 0 && bytes.IndexByte(s, '+') < 0 {
		return string(s), -1
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%':
			if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
				return "", i
			}
			b = append(b, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
		case '+':
			b = append(b, ' ')
		default:
			b = append(b, c)
		}
	}
	return string(b), -1
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// parseMultipart reads a multipart/form-data body with mime/multipart, as
// net/http's ParseMultipartForm does: a part with a file name is a file,
// any other part a text value. Errors give the offset of the delimiter of
// the part that failed, never the text of a header line.
func parseMultipart(body []byte, boundary string) (form, error) {
	if boundary == "" {
		return nil, invalidf("multipart body: the Content-Type has no boundary")
	}
	offs := delimiters(body, boundary)
	at := func(k int) int {
		if k < len(offs) {
			return offs[k]
		}
		return len(body)
	}
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	f := make(form)
	for k := 0; ; k++ {
		p, err := mr.NextPart()
		if err == io.EOF {
			return f, nil
		}
		if err != nil {
			return nil, multipartError(err, at(k))
		}
		v := formValue{headers: appendPartHeaders(nil, p.Header)}
		if p.FileName() != "" {
			h := sha256.New()
			if _, err := io.Copy(h, p); err != nil {
				return nil, multipartError(err, at(k))
			}
			v.file = true
			h.Sum(v.digest[:0])
		} else {
			b, err := io.ReadAll(p)
			if err != nil {
				return nil, multipartError(err, at(k))
			}
			v.text = string(b)
		}
		f.add(p.FormName(), at(k), v)
	}
}

func multipartError(err error, off int) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return invalidf("multipart body: unexpected end of the body in the part at offset %d", off)
	}
	return invalidf("multipart body: malformed part at offset %d", off)
}

// delimiters returns the offsets of the lines of body that start with the
// delimiter "--" boundary: where each part, and the closing delimiter, begin.
func delimiters(body []byte, boundary string) []int {
	delim := "--" + boundary
	var offs []int
	for i := 0; i < len(body); {
		j := bytes.Index(body[i:], []byte(delim))
		if j < 0 {
			break
		}
		j += i
		if j == 0 || body[j-1] == '\n' {
			offs = append(offs, j)
		}
		i = j + len(delim)
	}
	return offs
}

// appendPartHeaders appends the headers of a multipart part, normalized:
// the count, then per header name (canonical, sorted) its values in order.
// Content-Type and Content-Disposition are read as media types (type
// lower-cased, parameters as appendParams writes them); any other header
// takes part as sent. So a file sent under another file name or with
// another Content-Type is another value.
func appendPartHeaders(b []byte, h textproto.MIMEHeader) []byte {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = binary.AppendUvarint(b, uint64(len(keys)))
	for _, k := range keys {
		b = appendStr(b, k)
		b = binary.AppendUvarint(b, uint64(len(h[k])))
		for _, v := range h[k] {
			if k != "Content-Type" && k != "Content-Disposition" {
				b = append(b, 'r')
				b = appendStr(b, v)
				continue
			}
			mt, err := parseMediaType(v)
			if err != nil {
				b = append(b, 'r')
				b = appendStr(b, v)
				continue
			}
			b = append(b, 'm')
			b = appendStr(b, mt.typ)
			b = appendParams(b, mt)
		}
	}
	return b
}

// sumForm hashes a form: every field by name, names sorted, values in
// order, less the fields a single-token Exclude pointer names. Fields do
// not narrow a form: echo's form binder fills a nested struct from flat
// form names ("k" into Size.K, which JSON reaches as "/size/k" and "/size"
// selects whole), so no pointer can say which form names a selected value
// is made of, and a field left out could be one the handler reads. A field
// whose name is not a selected or excluded name but folds onto one (echo's
// binder falls back to strings.EqualFold) is refused.
func (st *state) sumForm(mediaType string, f form) (Fingerprint, error) {
	if err := st.checkFormFolds(f); err != nil {
		return "", err
	}
	for _, p := range st.prog.ptrs {
		if p.field < 0 && p.n == 1 {
			delete(f, st.prog.toks[p.first].name)
		}
	}
	b := appendHeader(st.out[:0], mediaType, 'A')
	names := make([]string, 0, len(f))
	for name := range f {
		names = append(names, name)
	}
	slices.Sort(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, name := range names {
		b = appendStr(b, name)
		b = appendValues(b, f[name])
	}
	st.out = b
	st.formFieldSums(f)
	return st.finish(b), nil
}

// formFieldSums writes, for SumRequestFields only, each selected field's
// pointer and values (count 0 when absent) to st.tmp: what tells a client
// which field it changed. It never takes part in the fingerprint. A
// pointer of more than one token names no form field, and stays absent.
func (st *state) formFieldSums(f form) {
	if len(st.prog.fields) == 0 || st.prog.root >= 0 {
		return
	}
	b := st.tmp[:0]
	for slot, ptr := range st.prog.fields {
		st.segs = append(st.segs, len(b))
		b = appendStr(b, ptr)
		var ff *formField
		for _, p := range st.prog.ptrs {
			if p.field == slot && p.n == 1 {
				ff = f[st.prog.toks[p.first].name]
				break
			}
		}
		if ff == nil {
			b = append(b, 0)
			continue
		}
		b = appendValues(b, ff)
	}
	st.tmp, st.segBuf = b, b
}

// checkFormFolds refuses a form field named like a selected or excluded
// field up to case folding. When several do, it names the first in the body.
func (st *state) checkFormFolds(f form) error {
	if len(st.prog.ptrs) == 0 {
		return nil
	}
	bad, off := -1, 0
	for name, ff := range f {
		if bad >= 0 && ff.off >= off {
			continue
		}
		for pi, p := range st.prog.ptrs {
			if p.n != 1 {
				continue
			}
			if t := st.prog.toks[p.first].name; name != t && strings.EqualFold(name, t) {
				bad, off = pi, ff.off
				break
			}
		}
	}
	if bad >= 0 {
		return foldedError(st.prog.ptrs[bad], "form field name", off)
	}
	return nil
}

func appendValues(b []byte, ff *formField) []byte {
	b = binary.AppendUvarint(b, uint64(len(ff.values)))
	for _, v := range ff.values {
		if v.file {
			b = append(b, 'f')
			b = appendStr(b, v.headers)
			b = append(b, v.digest[:]...)
		} else {
			b = append(b, 't')
			b = appendStr(b, v.headers)
			b = appendStr(b, v.text)
		}
	}
	return b
}
