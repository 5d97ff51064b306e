package pgrecords

import (
	"unsafe"

	"github.com/jackc/pgx/v5"
)

// largeObjects returns pgx's large objects API on tx.
//
// pgx.LargeObjects runs every call, and every call of the large objects
// it opens, through the Tx it holds, but only pgx's own transactions can
// make one, with themselves inside: pgx's transaction of an Atomic route
// runs its statements on the connection after the request, when the
// connection serves other requests. Built on the guarded transaction
// (lazyTx, savepoint), the calls fail with pgx.ErrTxClosed instead. The
// struct's one field is that Tx (TestLargeObjectsLayout checks it on
// every pgx upgrade), so it is set through a pointer to the struct.
func largeObjects(tx pgx.Tx) pgx.LargeObjects {
	var lo pgx.LargeObjects
	*(*pgx.Tx)(unsafe.Pointer(&lo)) = tx
	return lo
}
