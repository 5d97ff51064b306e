// Package redact keeps an idempotency key out of the errors that spans
// record: a store may name the key in its errors (a hand-written one, a
// driver quoting its arguments), and the key holds the tenant and user.
package redact

import "strings"

// Error returns err with each occurrence of key in its message replaced by
// "[key]"; errors.Is and errors.As still see err. A nil err stays nil.
func Error(err error, key string) error {
	if err == nil {
		return nil
	}
	return redacted{err, key}
}

type redacted struct {
	err error
	key string
}

func (r redacted) Error() string {
	msg := r.err.Error()
	if r.key == "" {
		return msg
	}
	return strings.ReplaceAll(msg, r.key, "[key]")
}

func (r redacted) Unwrap() error { return r.err }
