package fingerprint

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/url"
	"slices"
	"strings"
)

// parseMediaType returns the lower-cased media type of a Content-Type and
// its parameters. An empty Content-Type has the empty media type.
func parseMediaType(ct string) (string, map[string]string, error) {
	if strings.TrimSpace(ct) == "" {
		return "", nil, nil
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil && !errors.Is(err, mime.ErrInvalidMediaParameter) {
		return "", nil, invalidf("malformed Content-Type: %v", err)
	}
	return mt, params, nil
}

func isJSON(mt string) bool {
	return mt == mediaJSON || strings.HasSuffix(mt, "+json") && strings.IndexByte(mt, '/') > 0
}

// A formValue is one value of a form field: text, or a file by its digest.
type formValue struct {
	file   bool
	text   string
	digest [sha256.Size]byte
}

type form map[string][]formValue

func parseURLEncoded(body []byte) (form, error) {
	q, err := url.ParseQuery(string(body))
	if err != nil {
		return nil, invalidf("form body: %v", err)
	}
	f := make(form, len(q))
	for name, vs := range q {
		fv := make([]formValue, len(vs))
		for i, v := range vs {
			fv[i] = formValue{text: v}
		}
		f[name] = fv
	}
	return f, nil
}

func parseMultipart(body []byte, boundary string) (form, error) {
	if boundary == "" {
		return nil, invalidf("multipart body without a boundary")
	}
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	f := make(form)
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			return f, nil
		}
		if err != nil {
			return nil, invalidf("multipart body: %v", err)
		}
		var v formValue
		if p.FileName() != "" {
			h := sha256.New()
			if _, err := io.Copy(h, p); err != nil {
				return nil, invalidf("multipart body: %v", err)
			}
			v.file = true
			h.Sum(v.digest[:0])
		} else {
			b, err := io.ReadAll(p)
			if err != nil {
				return nil, invalidf("multipart body: %v", err)
			}
			v.text = string(b)
		}
		name := p.FormName()
		f[name] = append(f[name], v)
	}
}

// sumForm hashes a form: its fields by name, or the selected ones. A field
// is selected by a pointer with a single token; Exclude works the same way.
func (st *state) sumForm(mediaType string, f form) Fingerprint {
	for _, p := range st.prog.ptrs {
		if p.field < 0 && p.n == 1 {
			delete(f, st.prog.toks[p.first].name)
		}
	}
	var b []byte
	if len(st.prog.fields) == 0 || st.prog.root >= 0 {
		b = appendHeader(st.out[:0], mediaType, 'A')
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
	} else {
		b = appendHeader(st.out[:0], mediaType, 'F')
		b = binary.AppendUvarint(b, uint64(len(st.prog.fields)))
		for _, ptr := range st.prog.fields {
			b = appendStr(b, ptr)
			var vs []formValue
			if name, ok := singleName(ptr); ok {
				vs = f[name]
			}
			b = appendValues(b, vs)
		}
	}
	st.out = b
	return st.finish(b)
}

func appendValues(b []byte, vs []formValue) []byte {
	b = binary.AppendUvarint(b, uint64(len(vs)))
	for _, v := range vs {
		if v.file {
			b = append(b, 'f')
			b = append(b, v.digest[:]...)
		} else {
			b = append(b, 't')
			b = appendStr(b, v.text)
		}
	}
	return b
}
