package main

import (
	"context"
	"log/slog"

	"github.com/idemgate/idemgate/pgstore"
)

// workerPool runs the in-process workers.
type workerPool struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// startWorkers starts n workers on store.
func startWorkers(store *pgstore.Store, n int, gen generator, logger *slog.Logger) *workerPool {
	ctx, cancel := context.WithCancel(context.Background())
	w := &workerPool{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		<-ctx.Done()
	}()
	return w
}

// stop asks the workers to hand back their tasks and waits for them until ctx ends.
func (w *workerPool) stop(ctx context.Context) {
	w.cancel()
	select {
	case <-w.done:
	case <-ctx.Done():
	}
}
