package main

import (
	"context"
	"sync"
	"time"
)

// acks tells the nemesis when a client got a 2xx to a POST from an API
// node, so that an ack-kill can SIGKILL the node right after: whatever the
// node had not made durable before answering is then lost.
type acks struct {
	mu      sync.Mutex
	waiters map[string]chan string // node address → who waits for its next 2xx
}

// next waits until a client gets a 2xx to a POST from node, or until
// deadline; it returns what was answered ("" when nothing was).
func (a *acks) next(ctx context.Context, node string, deadline time.Time) string {
	ch := make(chan string, 1)
	a.mu.Lock()
	if a.waiters == nil {
		a.waiters = map[string]chan string{}
	}
	a.waiters[node] = ch
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.waiters, node)
		a.mu.Unlock()
	}()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case what := <-ch:
		return what
	case <-t.C:
	case <-ctx.Done():
	}
	return ""
}

// got reports a 2xx to a POST from node; what names it for the record.
func (a *acks) got(node, what string) {
	if a == nil {
		return
	}
	a.mu.Lock()
	ch := a.waiters[node]
	delete(a.waiters, node)
	a.mu.Unlock()
	if ch != nil {
		ch <- what
	}
}
