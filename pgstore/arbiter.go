package pgstore

import (
	"crypto/sha256"
	"sync/atomic"
)

// arbiter remembers which unique index a Store's inserts name in ON
// CONFLICT: the key's digest (schema v12, the zero value) or its columns
// (v2, before v12 or while v12 builds its index). A statement naming an
// index or a column that is not there fails at once (42P10, 42703),
// before it writes anything; the Store then names the other one and
// remembers it, so that a schema before v12 costs one failed statement
// per Store, and a Store running while v12 migrates follows it.
type arbiter struct{ columns atomic.Bool }

// missingArbiter reports whether err says that the statement's arbiter
// is not in the schema: no valid unique index matches its ON CONFLICT
// (42P10), or there is no key_digest column (42703: before v12).
func missingArbiter(err error) bool {
	c := sqlState(err)
	return c == codeNoConflictTarget || c == codeUndefinedColumn
}

// digest is the SHA-256 of t's full key, v12's key_digest: the UTF-8
// bytes of tenant, idempotency key, runtime and network joined by NUL
// bytes (keyDigestSQL computes the same in the database). No text in
// PostgreSQL holds a NUL (checkStorable refuses one), so two different
// keys never join to the same bytes.
func (t NewTask) digest() []byte {
	h := sha256.New()
	for i, s := range []string{t.Tenant, t.IdempotencyKey, t.Runtime, t.Network} {
		if i > 0 {
			h.Write([]byte{0})
		}
		h.Write([]byte(s))
	}
	return h.Sum(nil)
}

// submitStatement is Submit's statement on the digest's arbiter or, if
// onColumns, on the columns'.
func submitStatement(onColumns bool) string {
	if onColumns {
		return sqlSubmitWide
	}
	return sqlSubmit
}

// submitManyStatement is SubmitMany's statement on the digest's arbiter
// or, if onColumns, on the columns'.
func submitManyStatement(onColumns bool) string {
	if onColumns {
		return sqlSubmitManyWide
	}
	return sqlSubmitMany
}
