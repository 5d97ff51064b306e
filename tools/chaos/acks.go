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

// aims tells the nemesis's aimed faults about what clients are doing
// that no log shows in time: an export request sent to an API node (an
// export-pause stops that node while the export renders), and a cancel a
// client is about to send near the end of a generation (a cancel-slow
// slows the workers' Postgres links around it).
type aims struct {
	mu      sync.Mutex
	export  chan string    // nil unless an export-pause waits: the node an export was sent to
	cancels chan time.Time // nil unless a cancel-slow waits: when a client will cancel
}

// nextExport waits until a client sends an export request, or until
// deadline; it returns the node's address ("" when none was sent).
func (a *aims) nextExport(ctx context.Context, deadline time.Time) string {
	ch := make(chan string, 1)
	a.mu.Lock()
	a.export = ch
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.export = nil
		a.mu.Unlock()
	}()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case node := <-ch:
		return node
	case <-t.C:
	case <-ctx.Done():
	}
	return ""
}

// exportSent reports an export request sent to node.
func (a *aims) exportSent(node string) {
	if a == nil {
		return
	}
	a.mu.Lock()
	ch := a.export
	a.export = nil
	a.mu.Unlock()
	if ch != nil {
		ch <- node
	}
}

// nextCancel waits until a client says when it will cancel a running
// task, or until deadline; the zero time when none did.
func (a *aims) nextCancel(ctx context.Context, deadline time.Time) time.Time {
	ch := make(chan time.Time, 1)
	a.mu.Lock()
	a.cancels = ch
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.cancels = nil
		a.mu.Unlock()
	}()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case at := <-ch:
		return at
	case <-t.C:
	case <-ctx.Done():
	}
	return time.Time{}
}

// cancelAt reports that a client will cancel a running task at at.
func (a *aims) cancelAt(at time.Time) {
	if a == nil {
		return
	}
	a.mu.Lock()
	ch := a.cancels
	a.cancels = nil
	a.mu.Unlock()
	if ch != nil {
		ch <- at
	}
}
