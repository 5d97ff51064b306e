package idemgate

import (
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"
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
	// the handler's own status when it would not, such as a 429 or a 503:
	// then the answer says to retry (x-should-retry: true, Retry-After:
	// the handler's, or 1) when the handler sent a Retry-After or its
	// status is 408, 429, 502, 503 or 504, and not to otherwise (see
	// Problem.ShouldRetry).
	CodeResponseTooLarge Code = "response_too_large"
	// CodeBodyTimeout (408, with Retry-After): the request body did not
	// arrive before the server's read deadline (http.Server.ReadTimeout),
	// a slow upload or a stalled link. Nothing was claimed; a retry can
	// succeed.
	CodeBodyTimeout Code = "body_timeout"
	// CodeTxConflict (503, with Retry-After) on a Config.Atomic route: the
	// database rolled the handler's transaction back at its commit for a
	// concurrent transaction's sake (a serialization failure, a deadlock:
	// ErrTxConflict). Nothing of this run took effect and the claim was
	// released; a retry may commit.
	CodeTxConflict Code = "transaction_conflict"
	// CodeTxAborted (500) on a Config.Atomic route: the handler broke its
	// transaction (ErrTxAborted: it answered after a statement of its
	// failed, sent COMMIT or ROLLBACK itself, or began another), so the
	// answer could not be stored. The claim was released, but a retry
	// runs the same handler, which will most likely break it the same
	// way: not retryable.
	CodeTxAborted Code = "transaction_aborted"
)

// Retryable reports whether a retry of the same request with the same key
// can succeed: true for request_in_progress, store_unavailable,
// lease_lost, body_timeout and transaction_conflict, which also carry
// Retry-After; false for every other code, whose answer a retry would
// only repeat (key_reused is a decision for the caller, never an
// automatic retry). Every problem answer says which in its x-should-retry
// header, which generated API clients (Stainless: OpenAI's, Anthropic's,
// …) obey over the status code; response_too_large with the handler's
// own status follows that status (Problem.ShouldRetry).
func (c Code) Retryable() bool {
	switch c {
	case CodeRequestInProgress, CodeStoreUnavailable, CodeLeaseLost, CodeBodyTimeout, CodeTxConflict:
		return true
	}
	return false
}

// Problem is a problem the middleware answers, as Config.ErrorHandler
// receives it.
type Problem struct {
	// Status is the HTTP status, e.g. 409.
	Status int
	// Code says what happened; Code.Retryable says whether a retry with
	// the same key can succeed.
	Code Code
	// Title is the code's short, fixed summary, e.g. "Idempotency key
	// reused".
	Title string
	// Detail explains this occurrence to a person. It never carries the
	// key, the user or body content.
	Detail string
	// RetryAfter is how long to wait before a retry, in whole seconds, or
	// 0 when the answer has no Retry-After. It is set exactly when
	// ShouldRetry is true.
	RetryAfter time.Duration
	// Changed lists the JSON Pointers of the fields that differ, for a
	// key_reused with Config.Fingerprint.Fields (names, never values).
	Changed []string
}

// ShouldRetry reports whether the answer tells the client to retry (the
// x-should-retry header): when its code is Retryable, and for a
// response_too_large that keeps the handler's own status, when that
// status asked for a retry (its RetryAfter is set). A problem that says
// to retry always carries a Retry-After, one that does not never does.
func (p Problem) ShouldRetry() bool { return p.Code.Retryable() || p.RetryAfter > 0 }

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
func (m *Engine) problem(w http.ResponseWriter, r *http.Request, d Door, x any, status int, code Code, detail string, retryAfter int) error {
	return m.answer(w, r, d, x, Problem{Status: status, Code: code, Title: problemTitles[code], Detail: detail,
		RetryAfter: time.Duration(retryAfter) * time.Second})
}

// answer sets the headers every problem carries — whether to retry, when,
// and that it must not be cached — and hands p to the Door's Problem, or
// writes it as problem+json. An error handler that returns without
// writing leaves the answer to the default, so that a client never gets
// an empty 200 for a problem.
func (m *Engine) answer(w http.ResponseWriter, r *http.Request, d Door, x any, p Problem) error {
	h := w.Header()
	h.Del("Retry-After")
	if p.ShouldRetry() {
		p.RetryAfter = time.Duration(retrySeconds(p.RetryAfter)) * time.Second
		h.Set(shouldRetryHeader, "true")
		h.Set("Retry-After", strconv.Itoa(retrySeconds(p.RetryAfter)))
	} else {
		h.Set(shouldRetryHeader, "false")
	}
	h.Set("Cache-Control", "no-store")
	if answered, err := d.Problem(w, r, x, p); answered {
		return err
	}
	return writeProblem(w, p)
}

// shouldRetryHeader is the header of generated API clients (Stainless)
// that overrides their retry-by-status rule.
const shouldRetryHeader = "X-Should-Retry"

// writeProblem writes p as an application/problem+json (RFC 9457)
// document. It is built by hand: every string is a constant of this
// package except detail and the changed pointers, which are escaped.
func writeProblem(w http.ResponseWriter, p Problem) error {
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
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	_, err := w.Write(b)
	return err
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
