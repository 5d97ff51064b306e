package middleware

import (
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
)

// Code is the "code" extension member of every problem document the
// middleware answers (RFC 9457 application/problem+json), and the end of
// its "type" URI. Codes are a wire contract: clients branch on them, so a
// code's meaning never changes and a code is never reused for another.
type Code string

// The problem codes the middleware answers.
const (
	// CodeKeyMissing (400): Config.Required and no idempotency key.
	CodeKeyMissing Code = "key_missing"
	// CodeKeyInvalid (400): the key header is repeated, empty, too long
	// or not printable.
	CodeKeyInvalid Code = "key_invalid"
	// CodeKeyReused (Config.MismatchStatus, default 409): the key was
	// used with other parameters. A decision for the caller, never an
	// automatic retry.
	CodeKeyReused Code = "key_reused"
	// CodeRequestInProgress (409, with Retry-After): another request with
	// the key is still running.
	CodeRequestInProgress Code = "request_in_progress"
	// CodeBodyTooLarge (413): the body is over Config.MaxBodyBytes.
	CodeBodyTooLarge Code = "body_too_large"
	// CodeBodyInvalid (400): the body could not be read or fingerprinted.
	CodeBodyInvalid Code = "body_invalid"
	// CodeStoreUnavailable (503, with Retry-After): the store could not
	// be reached and the middleware fails closed.
	CodeStoreUnavailable Code = "store_unavailable"
	// CodeScopeInvalid (400): the credentials' tenant or user cannot
	// scope a key (empty or over 255 bytes). Retrying will not help.
	CodeScopeInvalid Code = "scope_invalid"
	// CodeEncodingNotAcceptable (406): the stored response's
	// Content-Encoding is not one the retry accepts, and it cannot be
	// decoded for it.
	CodeEncodingNotAcceptable Code = "encoding_not_acceptable"
	// CodeLeaseLost (503, with Retry-After) on a Config.Atomic route: the
	// request's claim ran out before its transaction could commit (another
	// request may have taken the key over), so the transaction was rolled
	// back. Nothing of this run took effect; a retry with the same key
	// runs it again or gets the other run's answer.
	CodeLeaseLost Code = "lease_lost"
	// CodeResponseTooLarge on a Config.Atomic route: the answer was over
	// Config.MaxResponseBytes, so it could not be held for the commit and
	// its transaction was rolled back. The status is 500 when the handler
	// answered a status that would be stored (retrying will not help), and
	// the handler's own status (with its Retry-After) when it would not,
	// such as a 429 or a 503.
	CodeResponseTooLarge Code = "response_too_large"
)

// problemTypeBase prefixes the code to make the RFC 9457 "type" URI.
const problemTypeBase = "https://github.com/idemgate/idemgate#"

var problemTitles = map[Code]string{
	CodeKeyMissing:            "Idempotency key missing",
	CodeKeyInvalid:            "Idempotency key invalid",
	CodeKeyReused:             "Idempotency key reused",
	CodeRequestInProgress:     "Request in progress",
	CodeBodyTooLarge:          "Request body too large",
	CodeBodyInvalid:           "Request body invalid",
	CodeStoreUnavailable:      "Idempotency store unavailable",
	CodeScopeInvalid:          "Identity unusable for idempotency",
	CodeEncodingNotAcceptable: "Stored response encoding not acceptable",
	CodeLeaseLost:             "Idempotency lease lost",
	CodeResponseTooLarge:      "Response too large to store",
}

// writeProblem answers an application/problem+json (RFC 9457) document.
// It is built by hand: every string is a constant of this package except
// detail, which is escaped.
func writeProblem(c echo.Context, status int, code Code, detail string, retryAfter int) error {
	return writeProblemExt(c, status, code, detail, retryAfter, nil)
}

// writeProblemChanged is writeProblem with the extension member "changed":
// the JSON Pointers of the fields that differ, when there are any.
func writeProblemChanged(c echo.Context, status int, code Code, detail string, changed []string) error {
	return writeProblemExt(c, status, code, detail, 0, changed)
}

func writeProblemExt(c echo.Context, status int, code Code, detail string, retryAfter int, changed []string) error {
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
