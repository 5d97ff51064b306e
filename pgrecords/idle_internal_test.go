package pgrecords

import (
	"math"
	"testing"
	"time"
)

// TestIdleLimit: twice the lease, from 1ms up to PostgreSQL's largest
// idle_in_transaction_session_timeout (INT_MAX ms), never negative or 0
// (which disables it) whatever the lease; TestAtomicHugeLeases runs the
// large ones through the server.
func TestIdleLimit(t *testing.T) {
	for _, tt := range []struct {
		lease, want time.Duration
	}{
		{time.Nanosecond, time.Millisecond},
		{400 * time.Microsecond, time.Millisecond},
		{time.Second, 2 * time.Second},
		{12 * 24 * time.Hour, 24 * 24 * time.Hour},
		{maxIdleLimit / 2, maxIdleLimit},
		{maxIdleLimit/2 + 1, maxIdleLimit},
		{13 * 24 * time.Hour, maxIdleLimit},
		{math.MaxInt64 / 2, maxIdleLimit},
		{math.MaxInt64/2 + 1, maxIdleLimit},
		{math.MaxInt64, maxIdleLimit},
	} {
		got := idleLimit(tt.lease)
		if got != tt.want {
			t.Errorf("idleLimit(%v) = %v, want %v", tt.lease, got, tt.want)
		}
		if ms := got.Milliseconds(); ms < 1 || ms > math.MaxInt32 {
			t.Errorf("idleLimit(%v) = %dms, outside 1..INT_MAX", tt.lease, ms)
		}
	}
}
