package wait_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/wait"
)

func TestUntil(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	if !wait.Until(10*time.Second, func() bool { return n.Add(1) == 3 }) {
		t.Fatal("Until gave up on a condition that holds on the third poll")
	}
	if got := n.Load(); got != 3 {
		t.Fatalf("polls = %d, want 3", got)
	}
	if wait.Until(20*time.Millisecond, func() bool { return false }) {
		t.Fatal("Until reported a condition that never holds")
	}
}

func ExampleUntil() {
	done := make(chan struct{})
	go close(done)
	closed := wait.Until(10*time.Second, func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	})
	fmt.Println(closed)
	// Output: true
}
