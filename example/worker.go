package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemgate/idemgate/pgstore"
)

// Worker timings. Uncertain tasks are looked at every rescueEvery and
// reconciled reconcileAfter after they became uncertain, so that a
// #timeout prompt resolves within seconds rather than pgstore's default
// half a minute.
const (
	rescueEvery    = 2 * time.Second
	reconcileAfter = 3 * time.Second
	// workerDrain is how long running tasks may finish at shutdown before
	// they are handed back to the queue; within shutdownBudget.
	workerDrain = 4 * time.Second
)

// workerPool runs a pgstore worker in this process.
type workerPool struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// startWorkers runs up to n tasks at once on store; n == 0 runs none.
func startWorkers(store *pgstore.Store, n int, gen generator, logger *slog.Logger) (*workerPool, error) {
	ctx, cancel := context.WithCancel(context.Background())
	p := &workerPool{cancel: cancel, done: make(chan struct{})}
	if n <= 0 {
		close(p.done)
		return p, nil
	}
	r := runner{gen: gen, logger: logger}
	w, err := pgstore.NewWorker(store, pgstore.WorkerConfig{
		Handler:           r.handle,
		Reconcile:         r.reconcile,
		Kinds:             []string{kindImages, kindMusic},
		Concurrency:       n,
		RescueInterval:    rescueEvery,
		ReconcileInterval: reconcileAfter,
		ShutdownTimeout:   workerDrain,
		Logger:            logger,
	})
	if err != nil {
		cancel()
		return nil, err
	}
	go func() {
		defer close(p.done)
		_ = w.Run(ctx)
	}()
	return p, nil
}

// stop ends the workers: running tasks finish or are handed back. It
// waits until they are done or ctx ends.
func (p *workerPool) stop(ctx context.Context) {
	p.cancel()
	select {
	case <-p.done:
	case <-ctx.Done():
	}
}

// runner turns tasks into calls of the stand-in generator.
type runner struct {
	gen    generator
	logger *slog.Logger
}

// handle runs one attempt of a task.
func (r runner) handle(ctx context.Context, t pgstore.Task) pgstore.Outcome {
	switch t.Kind {
	case kindImages:
		return r.images(ctx, t)
	case kindMusic:
		return r.music(ctx, t)
	}
	return pgstore.Failed(fmt.Errorf("unknown task kind %q", t.Kind))
}

// images renders the images of t. A recovered task resumes after the
// partial results it kept, so nothing made before is made again.
func (r runner) images(ctx context.Context, t pgstore.Task) pgstore.Outcome {
	var p imageParams
	if err := json.Unmarshal(t.Params, &p); err != nil {
		return pgstore.Failed(fmt.Errorf("bad task params: %w", err))
	}
	kept := t.Results
	made, err := r.gen.generate(ctx, p, len(kept))
	var partial *partialError
	switch {
	case errors.Is(err, errUpstreamTimeout):
		r.logger.Info("task uncertain: upstream timed out; will reconcile", "task", t.ID)
		return pgstore.Uncertain(err)
	case errors.As(err, &partial):
		r.logger.Info("task failed with partial results; POST /v1/tasks/{id}/recover resumes it", "task", t.ID)
		return pgstore.Failed(err, append(kept, encodeImages(partial.made)...)...)
	case err != nil && ctx.Err() != nil:
		return pgstore.Retry(0, fmt.Errorf("interrupted: %w", context.Cause(ctx)))
	case err != nil:
		r.logger.Info("task failed", "task", t.ID, "err", err)
		return pgstore.Failed(err)
	}
	results := append(kept, encodeImages(made)...)
	r.logger.Info("task done", "task", t.ID, "images", len(results))
	return pgstore.Succeeded(results...)
}

// reconcile resolves an uncertain task by asking the upstream what became
// of it: the stand-in upstream finished late, so the task gets its images
// on the same task ID.
func (r runner) reconcile(ctx context.Context, t pgstore.Task) pgstore.Outcome {
	switch t.Kind {
	case kindImages:
		var p imageParams
		if err := json.Unmarshal(t.Params, &p); err != nil {
			return pgstore.Failed(fmt.Errorf("bad task params: %w", err))
		}
		made, err := r.gen.reconcile(p)
		if err != nil {
			return pgstore.Failed(err)
		}
		r.logger.Info("task reconciled: the upstream had finished", "task", t.ID, "images", len(made))
		return pgstore.Succeeded(encodeImages(made)...)
	case kindMusic:
		return r.music(ctx, t)
	}
	return pgstore.Failed(fmt.Errorf("unknown task kind %q", t.Kind))
}

func (r runner) music(ctx context.Context, t pgstore.Task) pgstore.Outcome {
	var p musicParams
	if err := json.Unmarshal(t.Params, &p); err != nil {
		return pgstore.Failed(fmt.Errorf("bad task params: %w", err))
	}
	if err := r.gen.wait(ctx); err != nil {
		return pgstore.Retry(0, fmt.Errorf("interrupted: %w", err))
	}
	track, _ := json.Marshal(wavDataURL(renderWAV(p)))
	r.logger.Info("task done", "task", t.ID, "tracks", 1)
	return pgstore.Succeeded(track)
}

// encodeImages turns PNGs into result items: JSON strings holding data URLs.
func encodeImages(pngs [][]byte) []json.RawMessage {
	out := make([]json.RawMessage, len(pngs))
	for i, b := range pngs {
		out[i], _ = json.Marshal(dataURL(b))
	}
	return out
}
