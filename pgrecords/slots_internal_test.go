package pgrecords

import (
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestSlotsShared: every Store on one pool gets the same transaction
// slots (MaxConns-1), whichever goroutine asks first; another pool gets
// its own.
func TestSlotsShared(t *testing.T) {
	t.Parallel()
	pools := make([]*pgxpool.Pool, 2)
	for i := range pools {
		cfg, err := pgxpool.ParseConfig("postgres://127.0.0.1:1/x?pool_max_conns=5")
		if err != nil {
			t.Fatal(err)
		}
		if pools[i], err = pgxpool.NewWithConfig(t.Context(), cfg); err != nil { // connects lazily
			t.Fatal(err)
		}
		t.Cleanup(pools[i].Close)
	}
	got := make([]chan struct{}, 16)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() { got[i] = slotsOf(pools[i%2]) })
	}
	wg.Wait()
	for i, slots := range got {
		if slots != got[i%2] {
			t.Errorf("call %d got other slots than call %d on the same pool", i, i%2)
		}
		if cap(slots) != 4 {
			t.Errorf("call %d: %d slots, want MaxConns-1 = 4", i, cap(slots))
		}
	}
	if got[0] == got[1] {
		t.Errorf("two pools share their slots")
	}
}
