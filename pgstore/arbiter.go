package pgstore

import "sync/atomic"

// arbiter remembers which unique index a Store's inserts name in ON
// CONFLICT: the key's digest (schema v12, the zero value) or its columns
// (v2, before v12 or while v12 builds its index). A statement naming an
// index that is not there fails at once (42P10), before it writes
// anything; the Store then names the other one and remembers it, so that
// a schema before v12 costs one failed statement per Store, and a Store
// running while v12 migrates follows it.
type arbiter struct{ columns atomic.Bool }

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
