package middleware

import (
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
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
	CodeBodyTimeout:           "Request body timed out",
	CodeTxConflict:            "Transaction conflict",
	CodeTxAborted:             "Transaction broken by the handler",
}

// problem answers a problem; retryAfter is in seconds, 0 for none.
func (m *idem) problem(c echo.Context, status int, code Code, detail string, retryAfter int) error {
	return m.answer(c, Problem{Status: status, Code: code, Title: problemTitles[code], Detail: detail,
		RetryAfter: time.Duration(retryAfter) * time.Second})
}

// answer sets the headers every problem carries — whether to retry, when,
// and that it must not be cached — and hands p to Config.ErrorHandler, or
// writes it as problem+json. A handler that returns nil without writing
// leaves the answer to the default, so that a client never gets an empty
// 200 for a problem.
func (m *idem) answer(c echo.Context, p Problem) error {
	h := c.Response().Header()
	h.Del("Retry-After")
	if p.ShouldRetry() {
		p.RetryAfter = time.Duration(retrySeconds(p.RetryAfter)) * time.Second
		h.Set(shouldRetryHeader, "true")
		h.Set("Retry-After", strconv.Itoa(retrySeconds(p.RetryAfter)))
	} else {
		h.Set(shouldRetryHeader, "false")
	}
	h.Set("Cache-Control", "no-store")
	if m.cfg.ErrorHandler != nil {
		if err := m.cfg.ErrorHandler(c, p); err != nil || c.Response().Committed {
			return err
		}
	}
	return writeProblem(c, p)
}

// shouldRetryHeader is the header of generated API clients (Stainless)
// that overrides their retry-by-status rule.
const shouldRetryHeader = "X-Should-Retry"

// writeProblem writes p as an application/problem+json (RFC 9457)
// document. It is built by hand: every string is a constant of this
// package except detail and the changed pointers, which are escaped.
func writeProblem(c echo.Context, p Problem) error {
	b := make([]byte, 0, 256)
	b = append(b, `{"type":"`...)
	b = append(b, problemTypeBase...)
	b = append(b, p.Code...)
	b = append(b, `","title":`...)
	b = appendJSONString(b, p.Title)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(p.Status), 10)
	b = append(b, `,"detail":`...)
	b = appendJSONString(b, p.Detail)
	b = append(b, `,"code":"`...)
	b = append(b, p.Code...)
	b = append(b, '"')
	if len(p.Changed) > 0 {
		b = append(b, `,"changed":[`...)
		for i, ptr := range p.Changed {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, ptr)
		}
		b = append(b, ']')
	}
	b = append(b, "}\n"...)
	return c.Blob(p.Status, "application/problem+json", b)
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
