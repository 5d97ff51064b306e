package pgrecords

import (
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestLargeObjectsLayout: largeObjects writes pgx.LargeObjects' one field
// through a pointer to the struct; that holds only while the struct is
// exactly one field of type pgx.Tx.
func TestLargeObjectsLayout(t *testing.T) {
	typ := reflect.TypeFor[pgx.LargeObjects]()
	if typ.NumField() != 1 || typ.Field(0).Type != reflect.TypeFor[pgx.Tx]() || typ.Field(0).Offset != 0 {
		t.Fatalf("pgx.LargeObjects is %v with %d fields; largeObjects needs one field of type pgx.Tx", typ, typ.NumField())
	}
	var lo pgx.LargeObjects
	tx := &lazyTx{closed: true}
	lo = largeObjects(tx)
	if got := reflect.ValueOf(lo).Field(0); got.IsNil() || got.Elem().Pointer() != reflect.ValueOf(tx).Pointer() {
		t.Fatalf("largeObjects did not set the transaction")
	}
}
