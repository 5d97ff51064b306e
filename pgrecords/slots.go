package pgrecords

import (
	"runtime"
	"sync"
	"weak"

	"github.com/jackc/pgx/v5/pgxpool"
)

// poolSlots are the transaction slots of each pool that has a Store: the
// pool's MaxConns less one, shared by every Store on it. The bound is the
// pool's (one connection is always left for claims, completions and
// renewals); a Store of its own would let two Stores on one pool take
// every connection between them, and starve both stores' renewals.
//
// It is package state only because two Stores cannot otherwise learn
// that they share a pool. Its keys are weak: the entry of a pool goes
// when the pool is garbage collected, and it keeps no pool alive.
var poolSlots = struct {
	sync.Mutex
	m map[weak.Pointer[pgxpool.Pool]]chan struct{}
}{m: map[weak.Pointer[pgxpool.Pool]]chan struct{}{}}

// slotsOf returns the transaction slots of pool.
func slotsOf(pool *pgxpool.Pool) chan struct{} {
	k := weak.Make(pool)
	poolSlots.Lock()
	defer poolSlots.Unlock()
	if slots, ok := poolSlots.m[k]; ok {
		return slots
	}
	slots := make(chan struct{}, max(1, pool.Config().MaxConns-1))
	poolSlots.m[k] = slots
	runtime.AddCleanup(pool, func(k weak.Pointer[pgxpool.Pool]) {
		poolSlots.Lock()
		defer poolSlots.Unlock()
		delete(poolSlots.m, k)
	}, k)
	return slots
}
