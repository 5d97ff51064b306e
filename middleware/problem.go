package middleware

import (
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
)

// Problem codes: the "code" extension member of every error answer.
const (
	codeKeyMissing        = "key_missing"
	codeKeyInvalid        = "key_invalid"
	codeKeyReused         = "key_reused"
	codeRequestInProgress = "request_in_progress"
	codeBodyTooLarge      = "body_too_large"
	codeBodyInvalid       = "body_invalid"
	codeStoreUnavailable  = "store_unavailable"
	codeScopeInvalid      = "scope_invalid"
	// codeEncodingNotAcceptable: the stored response's Content-Encoding is
	// not one the retry accepts, and it cannot be decoded for it.
	codeEncodingNotAcceptable = "encoding_not_acceptable"
)

// problemTypeBase prefixes the code to make the RFC 9457 "type" URI.
const problemTypeBase = "https://github.com/idemgate/idemgate#"

var problemTitles = map[string]string{
	codeKeyMissing:            "Idempotency key missing",
	codeKeyInvalid:            "Idempotency key invalid",
	codeKeyReused:             "Idempotency key reused",
	codeRequestInProgress:     "Request in progress",
	codeBodyTooLarge:          "Request body too large",
	codeBodyInvalid:           "Request body invalid",
	codeStoreUnavailable:      "Idempotency store unavailable",
	codeScopeInvalid:          "Identity unusable for idempotency",
	codeEncodingNotAcceptable: "Stored response encoding not acceptable",
}

// writeProblem answers an application/problem+json (RFC 9457) document.
// It is built by hand: every string is a constant of this package except
// detail, which is escaped.
func writeProblem(c echo.Context, status int, code, detail string, retryAfter int) error {
	return writeProblemExt(c, status, code, detail, retryAfter, nil)
}

// writeProblemChanged is writeProblem with the extension member "changed":
// the JSON Pointers of the fields that differ, when there are any.
func writeProblemChanged(c echo.Context, status int, code, detail string, changed []string) error {
	return writeProblemExt(c, status, code, detail, 0, changed)
}

func writeProblemExt(c echo.Context, status int, code, detail string, retryAfter int, changed []string) error {
	b := make([]byte, 0, 256)
	b = append(b, `{"type":"`...)
	b = append(b, problemTypeBase...)
	b = append(b, code...)
	b = append(b, `","title":"`...)
	b = append(b, problemTitles[code]...)
	b = append(b, `","status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"detail":`...)
	b = appendJSONString(b, detail)
	b = append(b, `,"code":"`...)
	b = append(b, code...)
	b = append(b, '"')
	if len(changed) > 0 {
		b = append(b, `,"changed":[`...)
		for i, p := range changed {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, p)
		}
		b = append(b, ']')
	}
	b = append(b, "}\n"...)
	h := c.Response().Header()
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	h.Set("Cache-Control", "no-store")
	return c.Blob(status, "application/problem+json", b)
}

// appendJSONString appends s as a JSON string: quotes, backslashes and
// control characters escaped, invalid UTF-8 replaced by U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hexd = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c == 0x7f:
			b = append(b, '\\', 'u', '0', '0', hexd[c>>4], hexd[c&0xf])
		case c < utf8.RuneSelf:
			b = append(b, c)
		default:
			r, n := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && n == 1 {
				b = append(b, `\ufffd`...)
			} else {
				b = append(b, s[i:i+n]...)
			}
			i += n
			continue
		}
		i++
	}
	return append(b, '"')
}

// retrySeconds rounds d up to whole seconds for Retry-After, at least 1.
func retrySeconds(d time.Duration) int {
	s := int((d + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return s
}
