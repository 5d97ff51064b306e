package pgstore

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"time"
)

// WorkerConfig configures a Worker.
type WorkerConfig struct {
	// Handler runs the tasks. Required.
	Handler Handler
	// Reconcile resolves uncertain tasks: it is called with such a task
	// (same ID, Attempt increased) and returns what really happened:
	// Succeeded/Failed to finish it, Retry to run it again, Uncertain to
	// ask again after ReconcileInterval. A panic, a zero Outcome or a
	// Reconcile that outlasts its lease leaves the task uncertain.
	// Optional. Default nil: uncertain tasks stay uncertain (Store.Stats
	// counts them and their age).
	Reconcile Handler
	// Kinds limits the worker to tasks of these kinds. Optional. Default:
	// every kind. A worker of every kind reads the head of each kind
	// with waiting tasks at every claim (about 14 buffers a kind, never a
	// kind's backlog, nor anything of a paused or full kind), and while
	// any kind of the database has limits or is paused, it claims after
	// the kinds' lock statement and writes each outcome at once instead
	// of batching them. A worker that names its kinds pays for those only.
	Kinds []string
	// Policies sets how tasks of a kind run: their execution timeout and
	// what a lost attempt becomes. A kind without an entry gets the zero
	// KindPolicy's defaults. NewWorker copies the map. Optional.
	Policies map[string]KindPolicy
	// Name identifies the worker in the locked_by column. Optional.
	// Default: host name, process ID and a random suffix.
	Name string
	// Concurrency is how many tasks run at once. Optional. Default 16.
	Concurrency int
	// Lease is how long an attempt owns its task without a heartbeat.
	// The worker cancels an attempt whose lease it could not confirm a
	// tenth of a lease before the lease ends, by its own clock; a rescuer
	// takes the task a tenth of a lease after. Optional. Default 30s.
	Lease time.Duration
	// Heartbeat is how often leases are extended; each heartbeat waits at
	// most this long for the database. Optional. Default Lease/3.
	Heartbeat time.Duration
	// PollInterval is how often the worker looks for work without a
	// notification (behind a transaction pooler, LISTEN never fires).
	// Optional. Default 1s.
	PollInterval time.Duration
	// RescueInterval is how often the worker takes back tasks whose lease
	// expired and looks for uncertain tasks to reconcile. Optional.
	// Default Lease/2.
	RescueInterval time.Duration
	// ReconcileInterval is how long an uncertain task waits between
	// reconcile checks. Optional. Default 30s.
	ReconcileInterval time.Duration
	// MaxAttempts bounds the attempts of a task (per recovery); after the
	// last, a retry, an expired lease or a release at shutdown fails it.
	// Every claim counts, released ones too: a handler that outlasts
	// ShutdownTimeout at every restart must still end. All workers of a
	// database should agree on it. Optional. Default 5.
	MaxAttempts int
	// BackoffBase and BackoffMax shape the delay before a retry:
	// min(BackoffMax, BackoffBase·2^(attempt−1)), less a random jitter of
	// up to half. Optional. Defaults 1s and 5m.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// CompletionWait is how long the worker may hold a finished attempt's
	// outcome, while other handlers of the worker still run (or, with a
	// backlog, a claim is in flight), to write it in one statement with
	// theirs: a finished task shows its state at most this much later
	// (plus the write), and a busy worker sends fewer, larger writes. An
	// idle worker writes at once, and so does a worker some of whose
	// kinds have limits (a held outcome would keep its attempt counted
	// against MaxRunning) or whose Run context has ended. The handler's slot is free meanwhile.
	// Optional. Default 5ms; negative: write whatever is waiting at once.
	CompletionWait time.Duration
	// ShutdownTimeout is how long Run waits, once its context ends, for
	// running handlers to finish; then it releases their tasks for another
	// worker, cancels the handlers' contexts and waits up to
	// ShutdownTimeout/2 more for them to return. Optional. Default 10s.
	ShutdownTimeout time.Duration
	// Logger receives errors and lost leases. Optional. Default: discard.
	Logger *slog.Logger
	// OnEvent receives what the worker does, for metrics and logs. It is
	// called synchronously and must not block. Optional.
	OnEvent func(WorkerEvent)
}

// KindPolicy is how a worker runs the tasks of one kind.
type KindPolicy struct {
	// Timeout bounds one attempt. When it passes, the handler's context
	// is cancelled; an outcome it returns within a heartbeat still counts
	// if it is Succeeded or Failed, and otherwise the attempt ends as
	// Lost says, without waiting for the handler. Optional. Default
	// DefaultTimeout.
	Timeout time.Duration
	// Lost is what becomes of an attempt that ended without a final
	// outcome: its lease expired (the worker died, hung or was cut off),
	// it was released at shutdown, it timed out, or its handler panicked.
	// Optional. Default LostRetry.
	Lost LostPolicy
}

// DefaultCompletionWait is WorkerConfig.CompletionWait when none is set.
const DefaultCompletionWait = 5 * time.Millisecond

// DefaultTimeout is KindPolicy.Timeout when none is set.
const DefaultTimeout = 10 * time.Minute

// LostPolicy says what a lost attempt becomes.
type LostPolicy string

const (
	// LostRetry runs the task again, with backoff, up to MaxAttempts: for
	// work that is safe to repeat.
	LostRetry LostPolicy = "retry"
	// LostUncertain parks the task as uncertain, for Reconcile to find
	// out what happened: for work that may have reached an upstream that
	// must not be called twice (a paid generation, a payment).
	LostUncertain LostPolicy = "uncertain"
)

// policy returns the policy of kind, defaults applied.
func (c *WorkerConfig) policy(kind string) KindPolicy {
	p := c.Policies[kind]
	setDefault(&p.Timeout, DefaultTimeout)
	if p.Lost == "" {
		p.Lost = LostRetry
	}
	return p
}

// uncertainKinds lists the kinds whose lost attempts become uncertain.
func (c *WorkerConfig) uncertainKinds() []string {
	out := []string{}
	for kind, p := range c.Policies {
		if p.Lost == LostUncertain {
			out = append(out, kind)
		}
	}
	slices.Sort(out)
	return out
}

// withDefaults returns a copy of cfg with defaults applied, or an error
// for a configuration no worker can run.
func (cfg WorkerConfig) withDefaults() (WorkerConfig, error) {
	if cfg.Handler == nil {
		return cfg, errors.New("pgstore: worker: Handler is required")
	}
	if cfg.Name == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		cfg.Name = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	setDefault(&cfg.Concurrency, 16)
	setDefault(&cfg.Lease, 30*time.Second)
	setDefault(&cfg.Heartbeat, cfg.Lease/3)
	setDefault(&cfg.PollInterval, time.Second)
	setDefault(&cfg.RescueInterval, cfg.Lease/2)
	setDefault(&cfg.ReconcileInterval, 30*time.Second)
	setDefault(&cfg.MaxAttempts, 5)
	setDefault(&cfg.BackoffBase, time.Second)
	setDefault(&cfg.BackoffMax, 5*time.Minute)
	setDefault(&cfg.ShutdownTimeout, 10*time.Second)
	switch {
	case cfg.CompletionWait == 0:
		cfg.CompletionWait = DefaultCompletionWait
	case cfg.CompletionWait < 0:
		cfg.CompletionWait = 0
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Heartbeat >= cfg.Lease-2*leaseMargin(cfg.Lease) {
		return cfg, fmt.Errorf("pgstore: worker: Heartbeat %v must be shorter than Lease %v less a fifth", cfg.Heartbeat, cfg.Lease)
	}
	cfg.Kinds = slices.Clone(cfg.Kinds)
	if cfg.Kinds == nil {
		cfg.Kinds = []string{}
	}
	cfg.Policies = maps.Clone(cfg.Policies)
	for kind, p := range cfg.Policies {
		if p.Lost != "" && p.Lost != LostRetry && p.Lost != LostUncertain {
			return cfg, fmt.Errorf("pgstore: worker: kind %q: unknown Lost policy %q", kind, p.Lost)
		}
		if p.Timeout < 0 {
			return cfg, fmt.Errorf("pgstore: worker: kind %q: negative Timeout", kind)
		}
	}
	return cfg, nil
}

func setDefault[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// leaseMargin is the safety margin on each side of a lease's end: the
// holder gives the attempt up this long before it, a rescuer takes the
// task this long after. It covers clock drift between the hosts and the
// time a cancelled handler needs to notice.
func leaseMargin(lease time.Duration) time.Duration {
	return lease / 10
}
