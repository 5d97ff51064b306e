package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
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
	// pruneEvery is how often a worker process deletes tasks that
	// finished longer than taskRetention ago.
	pruneEvery = 10 * time.Minute
)

// taskRetention is how long a finished task stays in Postgres. A pruned
// task's key is free again, so a retry of its request would make a new
// task: it must outlive every replay of the request the middleware
// could still serve (idemRetention), and does, by a day of slack.
const taskRetention = idemRetention + 24*time.Hour

// attemptTimeout bounds one attempt of a task: generously above the
// stand-in generator's time (which the -gen-time flag sets).
func attemptTimeout(genTime time.Duration) time.Duration {
	return max(30*time.Second, 4*genTime)
}

// workerPool runs a pgstore worker and the pruner in this process.
type workerPool struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// defaultPolicy is what a lost attempt (lease expired, worker killed or
// shut down) becomes, per kind. A generation is paid for: an attempt cut
// off after the request went out must not make a second one, so it becomes
// uncertain and reconcile asks the upstream. Music is rendered in process:
// running it again is free.
var defaultPolicy = map[string]pgstore.LostPolicy{kindImages: pgstore.LostUncertain, kindMusic: pgstore.LostRetry}

// parsePolicy reads TASK_POLICY, "kind=uncertain|retry,...", over the
// defaults: a kind it does not name keeps its default.
func parsePolicy(s string) (map[string]pgstore.LostPolicy, error) {
	out := maps.Clone(defaultPolicy)
	for part := range strings.SplitSeq(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		kind, pol, ok := strings.Cut(part, "=")
		if _, known := defaultPolicy[kind]; !known || !ok ||
			(pol != string(pgstore.LostUncertain) && pol != string(pgstore.LostRetry)) {
			return nil, fmt.Errorf("policy %q: want %s or %s =uncertain or =retry", part, kindImages, kindMusic)
		}
		out[kind] = pgstore.LostPolicy(pol)
	}
	return out, nil
}

// formatPolicy is the startup line's form of p: kinds sorted.
func formatPolicy(p map[string]pgstore.LostPolicy) string {
	parts := make([]string, 0, len(p))
	for _, kind := range slices.Sorted(maps.Keys(p)) {
		parts = append(parts, kind+"="+string(p[kind]))
	}
	return strings.Join(parts, ",")
}

// workerOptions says how a process runs its workers.
type workerOptions struct {
	n      int       // tasks run at once; 0 runs none
	gen    generator // the stand-in generator
	policy map[string]pgstore.LostPolicy
	name   string        // names the worker in logs and in the upstream's call log
	lease  time.Duration // the attempts' lease; 0: pgstore's default
}

// startWorkers runs up to n tasks at once on b's store with the default
// policy, and prunes old tasks; n == 0 runs none (and prunes nothing).
// obs, when not nil, instruments the worker.
func startWorkers(b *backends, n int, gen generator, logger *slog.Logger, obs *observer) (*workerPool, error) {
	return runWorkers(b, workerOptions{n: n, gen: gen}, logger, obs)
}

// runWorkers is startWorkers with every option.
func runWorkers(b *backends, o workerOptions, logger *slog.Logger, obs *observer) (*workerPool, error) {
	n, gen := o.n, o.gen
	policy := o.policy
	if policy == nil {
		policy = defaultPolicy
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &workerPool{cancel: cancel, done: make(chan struct{})}
	if n <= 0 {
		close(p.done)
		return p, nil
	}
	up := upstream{gen: gen, log: b.pool, caller: o.name}
	if err := up.prepare(ctx); err != nil {
		cancel()
		return nil, fmt.Errorf("stand-in upstream: %w", err)
	}
	r := runner{up: up, logger: logger}
	policies := make(map[string]pgstore.KindPolicy, len(policy))
	for kind, lost := range policy {
		policies[kind] = pgstore.KindPolicy{Timeout: attemptTimeout(gen.took), Lost: lost}
	}
	cfg := pgstore.WorkerConfig{
		Handler:           r.handle,
		Reconcile:         r.reconcile,
		Kinds:             []string{kindImages, kindMusic},
		Policies:          policies,
		Name:              o.name,
		Concurrency:       n,
		RescueInterval:    rescueEvery,
		ReconcileInterval: reconcileAfter,
		ShutdownTimeout:   workerDrain,
		Logger:            logger,
		Lease:             o.lease,
	}
	obs.worker(&cfg)
	w, err := pgstore.NewWorker(b.store, cfg)
	if err != nil {
		cancel()
		return nil, err
	}
	var wg workers
	wg.run(func() { _ = w.Run(ctx) })
	wg.run(func() { prune(ctx, b.store, logger) })
	go func() {
		defer close(p.done)
		wg.wait()
	}()
	return p, nil
}

// workers waits for a few goroutines.
type workers struct{ done []chan struct{} }

func (ws *workers) run(f func()) {
	done := make(chan struct{})
	ws.done = append(ws.done, done)
	go func() {
		defer close(done)
		f()
	}()
}

func (ws *workers) wait() {
	for _, d := range ws.done {
		<-d
	}
}

// prune runs pruneOnce now and every pruneEvery until ctx ends.
func prune(ctx context.Context, store *pgstore.Store, logger *slog.Logger) {
	t := time.NewTicker(pruneEvery)
	defer t.Stop()
	for {
		pruneOnce(ctx, store, logger)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pruneOnce deletes tasks that finished more than taskRetention ago, and
// says so when uncertain tasks wait (they are never pruned): how many,
// and the oldest one's age.
func pruneOnce(ctx context.Context, store *pgstore.Store, logger *slog.Logger) {
	if n, err := store.Prune(ctx, taskRetention); err != nil && ctx.Err() == nil {
		logger.Warn("prune tasks", "err", err)
	} else if n > 0 {
		logger.Info("pruned finished tasks", "tasks", n, "older_than", taskRetention)
	}
	if st, err := store.Stats(ctx); err == nil && st.OldestUncertain > 0 {
		uncertain := 0
		for _, states := range st.Counts {
			uncertain += states[pgstore.StateUncertain]
		}
		logger.Warn("uncertain tasks wait for reconciliation", "tasks", uncertain,
			"oldest", st.OldestUncertain.Round(time.Second))
	}
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

// runner turns tasks into calls of the stand-in upstream.
type runner struct {
	up     upstream
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
	made, err := r.up.call(ctx, t.ID, upstreamKey(t), p, len(kept))
	return r.imageOutcome(t, kept, made, err, ctx.Err() != nil)
}

// upstreamKey is the Idempotency-Key an attempt of t sends the upstream:
// the same for every attempt of one run of the task, so a second attempt
// after a lost one (its worker killed mid-call, its lease run out, the
// task retried) joins the job the first one started instead of paying for
// another; a new one after Recover, which asks for the images still
// missing. Not the attempt number: that changes on every attempt.
func upstreamKey(t pgstore.Task) string {
	return fmt.Sprintf("%s:%d", t.ID, t.Recoveries)
}

// imageOutcome turns what the upstream answered into the task's outcome.
func (r runner) imageOutcome(t pgstore.Task, kept []json.RawMessage, made [][]byte, err error, interrupted bool) pgstore.Outcome {
	var partial *partialError
	switch {
	case errors.Is(err, errUpstreamTimeout):
		r.logger.Info("task uncertain: upstream timed out; will reconcile", "task", t.ID)
		return pgstore.Uncertain(err)
	case errors.As(err, &partial):
		r.logger.Info("task failed with partial results; POST /v1/tasks/{id}/recover resumes it", "task", t.ID)
		return pgstore.Failed(err, append(kept, encodeImages(partial.made)...)...)
	case errors.Is(err, errMaybeSent):
		// The request went out and its answer was lost: only the
		// upstream knows; reconcile asks it.
		r.logger.Info("task uncertain: answer lost; will reconcile", "task", t.ID)
		return pgstore.Uncertain(err)
	case errors.Is(err, errNotSent):
		// Nothing reached the upstream: safe to run again.
		return pgstore.Retry(0, err)
	case err != nil && interrupted:
		// The request went out: the kind's policy (uncertain) decides.
		r.logger.Info("task uncertain: interrupted; will reconcile", "task", t.ID)
		return pgstore.Uncertain(fmt.Errorf("interrupted: %w", err))
	case err != nil:
		r.logger.Info("task failed", "task", t.ID, "err", err)
		return pgstore.Failed(err)
	}
	results := append(kept, encodeImages(made)...)
	r.logger.Info("task done", "task", t.ID, "images", len(results))
	return pgstore.Succeeded(results...)
}

// reconcile resolves an uncertain task by asking the upstream what became
// of its request: never received (run it again), still running (ask
// later), or done (its images, or its error, on the same task ID).
func (r runner) reconcile(ctx context.Context, t pgstore.Task) pgstore.Outcome {
	switch t.Kind {
	case kindImages:
		_, o := r.reconcileImages(ctx, t)
		return o
	case kindMusic:
		return r.music(ctx, t)
	}
	return pgstore.Failed(fmt.Errorf("unknown task kind %q", t.Kind))
}

// What reconciling an image task found out.
type finding int

const (
	foundNothing  finding = iota // the upstream could not be asked: ask again later
	foundNever                   // the upstream never received the request: run it again
	foundRunning                 // the upstream still works on it: ask again later
	foundFinished                // the upstream is done: its answer ends the task
)

func (r runner) reconcileImages(ctx context.Context, t pgstore.Task) (finding, pgstore.Outcome) {
	var p imageParams
	if err := json.Unmarshal(t.Params, &p); err != nil {
		return foundFinished, pgstore.Failed(fmt.Errorf("bad task params: %w", err))
	}
	kept := t.Results
	state, made, err := r.up.lookup(ctx, t.ID, p, len(kept))
	switch {
	case err != nil && state != callDone:
		return foundNothing, pgstore.Uncertain(err)
	case state == callNever:
		r.logger.Info("task reconciled: the upstream never got it; running it again", "task", t.ID)
		return foundNever, pgstore.Retry(0, errors.New("the upstream never received the request"))
	case state == callRunning:
		return foundRunning, pgstore.Uncertain(errors.New("the upstream is still working on it"))
	}
	r.logger.Info("task reconciled: the upstream had finished", "task", t.ID, "images", len(made))
	return foundFinished, r.imageOutcome(t, kept, made, err, false)
}

func (r runner) music(ctx context.Context, t pgstore.Task) pgstore.Outcome {
	var p musicParams
	if err := json.Unmarshal(t.Params, &p); err != nil {
		return pgstore.Failed(fmt.Errorf("bad task params: %w", err))
	}
	if err := r.up.gen.wait(ctx); err != nil {
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

// workerOptions reads the worker settings of s; name defaults to host:pid,
// which is what pgstore names a worker by default too.
func (s settings) workerOptions() (workerOptions, error) {
	policy, err := parsePolicy(s.policy)
	if err != nil {
		return workerOptions{}, fmt.Errorf("TASK_POLICY (-policy): %w", err)
	}
	name := s.workerName
	if name == "" {
		host, _ := os.Hostname()
		name = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	return workerOptions{n: s.workers, gen: generator{took: s.genTime}, policy: policy, name: name, lease: s.taskLease}, nil
}
