package pgstore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// ErrInvalidTask reports a task that Submit, SubmitTx or SubmitMany
// refused before it reached the database: an empty field, a priority or
// RunAfter out of range, or text or params Postgres cannot store (NUL,
// invalid UTF-8, a \u0000 or unpaired surrogate escape in params).
// Submitting the same task again cannot succeed: answer the client with
// a 4xx, not a retryable 5xx. The wrapping error says what is wrong.
var ErrInvalidTask = errors.New("pgstore: submit: invalid task")

// checkStorable refuses a task Postgres would refuse to store: its text
// with NUL or invalid UTF-8, params that are not JSON or hold a string
// jsonb refuses. Found before the statement, it is the task's own error:
// it does not fail a SubmitMany batch, abort the caller's transaction
// in SubmitTx, or read as an outage.
func (t NewTask) checkStorable() error {
	for _, f := range []struct{ name, v string }{
		{"tenant", t.Tenant}, {"owner", t.Owner}, {"kind", t.Kind}, {"runtime", t.Runtime},
		{"network", t.Network}, {"idempotency key", t.IdempotencyKey}, {"fingerprint", t.Fingerprint},
	} { // Trace is not here: it is opaque, and stored made storable
		if !utf8.ValidString(f.v) || strings.IndexByte(f.v, 0) >= 0 {
			return fmt.Errorf("%w: %s: NUL or invalid UTF-8, which Postgres cannot store", ErrInvalidTask, f.name)
		}
	}
	if len(t.Params) > 0 {
		if !json.Valid(t.Params) {
			return fmt.Errorf("%w: params: not valid JSON", ErrInvalidTask)
		}
		if !bytes.Equal(storableJSON(t.Params), t.Params) {
			return fmt.Errorf("%w: params: a string jsonb cannot store (\\u0000, an unpaired surrogate or invalid UTF-8)", ErrInvalidTask)
		}
	}
	return nil
}

// Postgres refuses some text a handler may produce: text columns cannot
// hold NUL or invalid UTF-8, and jsonb refuses the escape \u0000 and
// surrogate escapes that do not pair up. A refused write would lose the
// outcome (and the task would run again), so what is stored is made
// storable first, each offending character becoming U+FFFD, the Unicode
// replacement character.

// storableText returns s with NUL bytes and invalid UTF-8 replaced.
func storableText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

// storableJSON returns valid JSON b with its string escapes that jsonb
// refuses (\u0000, unpaired surrogates) and any invalid UTF-8 replaced
// by U+FFFD. It returns b itself when nothing needs replacing.
func storableJSON(b []byte) []byte {
	if !bytes.Contains(b, []byte(`\u`)) {
		return bytes.ToValidUTF8(b, []byte("\uFFFD"))
	}
	b = bytes.ToValidUTF8(b, []byte("\uFFFD"))
	var out []byte // nil until something changes
	inString := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !inString {
			if c == '"' {
				inString = true
			}
			continue
		}
		switch c {
		case '"':
			inString = false
			continue
		case '\\':
		default:
			continue
		}
		// An escape: \x or \uXXXX.
		if i+1 >= len(b) || b[i+1] != 'u' {
			i++ // skip the escaped character (\" included)
			continue
		}
		r, ok := hex4(b, i+2)
		if !ok {
			i++
			continue
		}
		keep := 6 // bytes of escapes that stay
		switch {
		case r == 0:
			keep = 0
		case r >= 0xD800 && r <= 0xDBFF:
			if lo, ok := hex4(b, i+8); ok && i+7 < len(b) && b[i+6] == '\\' && b[i+7] == 'u' && lo >= 0xDC00 && lo <= 0xDFFF {
				keep = 12 // a pair
			} else {
				keep = 0
			}
		case r >= 0xDC00 && r <= 0xDFFF:
			keep = 0
		}
		if keep == 0 {
			if out == nil {
				out = make([]byte, 0, len(b))
			}
			out = append(append(out, b[:i]...), `\ufffd`...)
			b, i = b[i+6:], -1 // go on after the escape, still in the string
			continue
		}
		i += keep - 1
	}
	if out == nil {
		return b
	}
	return append(out, b...)
}

// hex4 decodes the four hex digits at b[i:i+4].
func hex4(b []byte, i int) (rune, bool) {
	if i < 0 || i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		var v byte
		switch {
		case c >= '0' && c <= '9':
			v = c - '0'
		case c >= 'a' && c <= 'f':
			v = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			v = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(v)
	}
	return r, true
}
