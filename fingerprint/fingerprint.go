package fingerprint

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// ErrInvalid reports a body or a Spec that cannot be fingerprinted: malformed
// JSON, a duplicate member name, invalid UTF-8, a lone surrogate, a number
// outside the double range, nesting deeper than MaxDepth, or a malformed JSON
// Pointer. Errors returned by this package wrap it with the reason.
var ErrInvalid = errors.New("fingerprint: invalid input")

// Fingerprint identifies a set of request parameters: "v1:" followed by 64
// lowercase hex digits of a SHA-256 digest.
type Fingerprint string

// Spec selects the parts of a request body that take part in a fingerprint.
// The zero Spec fingerprints the whole body.
type Spec struct {
	// Fields lists RFC 6901 JSON Pointers whose values take part. Empty means
	// the whole body.
	Fields []string
	// Exclude lists RFC 6901 JSON Pointers removed before hashing (trace ids,
	// client notes).
	Exclude []string
}

// Validate reports a malformed JSON Pointer in s. Call it once when building
// the middleware: a bad pointer is a configuration error, not a per-request one.
func (s Spec) Validate() error {
	for _, p := range s.Fields {
		if _, err := parsePointer(p); err != nil {
			return fmt.Errorf("fingerprint: field %q: %w", p, err)
		}
	}
	for _, p := range s.Exclude {
		if _, err := parsePointer(p); err != nil {
			return fmt.Errorf("fingerprint: exclude %q: %w", p, err)
		}
	}
	return nil
}

// parsePointer splits an RFC 6901 JSON Pointer into unescaped reference tokens.
func parsePointer(p string) ([]string, error) {
	if p == "" {
		return nil, nil
	}
	if p[0] != '/' {
		return nil, fmt.Errorf("%w: json pointer must be empty or start with '/'", ErrInvalid)
	}
	toks := strings.Split(p[1:], "/")
	for i, t := range toks {
		if !strings.Contains(t, "~") {
			continue
		}
		var b strings.Builder
		for j := 0; j < len(t); j++ {
			if t[j] != '~' {
				b.WriteByte(t[j])
				continue
			}
			if j+1 < len(t) && t[j+1] == '0' {
				b.WriteByte('~')
			} else if j+1 < len(t) && t[j+1] == '1' {
				b.WriteByte('/')
			} else {
				return nil, fmt.Errorf("%w: json pointer has '~' not followed by '0' or '1'", ErrInvalid)
			}
			j++
		}
		toks[i] = b.String()
	}
	return toks, nil
}

// Canonicalize returns the RFC 8785 canonical form of a JSON text.
func Canonicalize(json []byte) ([]byte, error) {
	return nil, fmt.Errorf("%w: not implemented yet", ErrInvalid)
}

// Sum fingerprints a JSON body.
func (s Spec) Sum(body []byte) (Fingerprint, error) {
	if err := s.Validate(); err != nil {
		return "", err
	}
	return sumBytes("application/json", body), nil
}

// SumRequest fingerprints a request body according to its Content-Type.
func (s Spec) SumRequest(r *http.Request, body []byte) (Fingerprint, error) {
	return s.Sum(body)
}

func sumBytes(mediaType string, body []byte) Fingerprint {
	h := sha256.New()
	h.Write([]byte(strconv.Itoa(len(mediaType)) + ":" + mediaType))
	h.Write(body)
	return Fingerprint("v1:" + hex.EncodeToString(h.Sum(nil)))
}
