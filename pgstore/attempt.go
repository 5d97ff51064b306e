package pgstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Why an attempt's context was cancelled (context.Cause).
var (
	errLeaseLost    = errors.New("pgstore: lease lost: another attempt holds the task")
	errLeaseExpired = errors.New("pgstore: lease not confirmed in time")
	errTimedOut     = errors.New("pgstore: attempt timed out")
	errCancelled    = errors.New("pgstore: task cancelled")
	errShutdown     = errors.New("pgstore: worker shut down; task released")
)

// errWorkerStopped refuses the write of a handler that outlived Run.
var errWorkerStopped = errors.New("pgstore: worker stopped; outcome discarded")

// attempt is one run of the Handler (or of Reconcile) on a claimed task.
type attempt struct {
	task   Task
	from   State // running; uncertain for a Reconcile
	policy KindPolicy
	ctx    context.Context
	cancel context.CancelCauseFunc
	began  time.Time

	// expiry cancels ctx when the lease can no longer be confirmed: the
	// claim's or last confirmed heartbeat's send time plus the lease less
	// its margin, by this process's monotonic clock.
	expiry *time.Timer
	// settled is set once the attempt's transition was written (or given
	// up): the heartbeat no longer extends its lease.
	settled atomic.Bool
	// handedOff is set (under attempts.mu) once the handler returned and
	// the attempt waits only for its transition's write: its slot is free.
	handedOff bool
}

func newAttempt(base context.Context, t Task, from State, policy KindPolicy, sent time.Time, lease time.Duration) *attempt {
	ctx, cancel := context.WithCancelCause(base)
	a := &attempt{task: t, from: from, policy: policy, ctx: ctx, cancel: cancel, began: time.Now()}
	a.expiry = time.AfterFunc(time.Until(sent.Add(lease-leaseMargin(lease))), func() { cancel(errLeaseExpired) })
	return a
}

// confirm moves the local lease deadline after a heartbeat sent at sent
// extended the lease, unless the attempt has ended already.
func (a *attempt) confirm(sent time.Time, lease time.Duration) {
	if a.ctx.Err() != nil {
		return
	}
	a.expiry.Reset(time.Until(sent.Add(lease - leaseMargin(lease))))
}

// stop ends the attempt's timers and context.
func (a *attempt) stop() {
	a.expiry.Stop()
	a.cancel(nil)
}

// attempts are the attempts a worker runs, by task ID: at most one per
// task, so that a worker never runs a task twice at once.
//
// A cancellation can arrive while a claim is in flight: Store.Cancel
// commits after the claim did, and its notification may come before the
// claimed attempts are registered. While any claim is in flight, a
// cancellation of a task without an attempt is kept, and registering the
// claim's attempts applies it, so no notification falls between the two.
type attempts struct {
	mu sync.Mutex
	m  map[string]*attempt

	claiming  int             // claims in flight
	reserved  int             // slots the claims in flight may fill
	squeezed  bool            // a claim got fewer slots for the reservations of others
	cancelled map[string]bool // tasks cancelled while claims were in flight
	writing   int             // attempts handed off, waiting for their write
}

// beginClaim records that a claim is in flight, for up to the free slots
// of a worker of concurrency slots, and returns how many it may take:
// they are reserved for it until register ends it. The claim loop and a
// Reconcile's claim run at once; without the reservation both would
// claim the same free slots.
func (as *attempts) beginClaim(concurrency int) int {
	as.mu.Lock()
	defer as.mu.Unlock()
	n := as.freeLocked(concurrency)
	as.squeezeLocked(n, concurrency)
	as.claiming++
	as.reserved += n
	return n
}

// register adds the attempts of a claim that beginClaim announced for n
// slots, cancels those whose task was cancelled meanwhile, and ends the
// claim. It reports whether the claim loop must look at the free slots
// again: a claim got fewer for the reservations of others, which are
// all over now (nothing else would wake it).
func (as *attempts) register(claimed []*attempt, n int) (again bool) {
	as.mu.Lock()
	defer as.mu.Unlock()
	as.reserved -= n
	for _, a := range claimed {
		as.addLocked(a)
		if as.cancelled[a.task.ID] {
			a.cancel(errCancelled)
		}
	}
	as.claiming--
	if as.claiming == 0 {
		clear(as.cancelled)
		again, as.squeezed = as.squeezed, false
	}
	return again
}

// cancel cancels the attempt of a task that Store.Cancel ended, or, while
// a claim is in flight, keeps the cancellation for the claim's attempts.
func (as *attempts) cancel(id string) {
	as.mu.Lock()
	defer as.mu.Unlock()
	if a := as.m[id]; a != nil {
		a.cancel(errCancelled)
		return
	}
	if as.claiming > 0 {
		if as.cancelled == nil {
			as.cancelled = map[string]bool{}
		}
		as.cancelled[id] = true
	}
}

// addLocked registers a, with as.mu held; an earlier attempt of the same
// task (which the claim excludes, so only a bug could leave) is cancelled
// as stale.
func (as *attempts) addLocked(a *attempt) {
	if as.m == nil {
		as.m = map[string]*attempt{}
	}
	if old := as.m[a.task.ID]; old != nil {
		old.cancel(errLeaseLost)
		if old.handedOff {
			as.writing--
		}
	}
	as.m[a.task.ID] = a
}

// handOff frees a's slot: its handler returned, and what is left is the
// write of its transition. The attempt stays registered (its task is not
// claimed again, its lease is kept) until remove.
func (as *attempts) handOff(a *attempt) {
	as.mu.Lock()
	defer as.mu.Unlock()
	if as.m[a.task.ID] == a && !a.handedOff {
		a.handedOff = true
		as.writing++
	}
}

// handedOffNow reports whether a's handler returned (handOff).
func (as *attempts) handedOffNow(a *attempt) bool {
	as.mu.Lock()
	defer as.mu.Unlock()
	return a.handedOff
}

// unwritten returns the attempts of running tasks whose handler
// returned and which are still registered: their transition was not
// written (or not yet).
func (as *attempts) unwritten() []*attempt {
	as.mu.Lock()
	defer as.mu.Unlock()
	var out []*attempt
	for _, a := range as.m {
		if a.from == StateRunning && a.handedOff {
			out = append(out, a)
		}
	}
	return out
}

// remove unregisters a, unless a newer attempt replaced it.
func (as *attempts) remove(a *attempt) {
	as.mu.Lock()
	defer as.mu.Unlock()
	if as.m[a.task.ID] == a {
		delete(as.m, a.task.ID)
		if a.handedOff {
			as.writing--
		}
	}
}

// count is how many slots are taken: attempts whose handler has not
// handed off.
func (as *attempts) count() int {
	as.mu.Lock()
	defer as.mu.Unlock()
	return len(as.m) - as.writing
}

// free is how many attempts a worker of concurrency slots may start now:
// its free slots, while the outcomes waiting for their write stay within
// maxWritingPerSlot × concurrency, so that writes that keep failing
// cannot let claims run on without bound.
func (as *attempts) free(concurrency int) int {
	as.mu.Lock()
	defer as.mu.Unlock()
	n := as.freeLocked(concurrency)
	as.squeezeLocked(n, concurrency)
	return n
}

// squeezeLocked records, with as.mu held, that n slots were found free
// where there were more but for the reservations of claims in flight:
// when they end, register says to look again.
func (as *attempts) squeezeLocked(n, concurrency int) {
	if as.reserved > 0 && n < as.freeLocked(concurrency)+as.reserved {
		as.squeezed = true
	}
}

// freeLocked is free, with as.mu held: slots reserved by claims in flight
// are not free.
func (as *attempts) freeLocked(concurrency int) int {
	return max(0, min(concurrency-(len(as.m)-as.writing), (1+maxWritingPerSlot)*concurrency-len(as.m))-as.reserved)
}

// maxWritingPerSlot bounds the outcomes waiting for their write, per slot.
const maxWritingPerSlot = 4

// busy is how many outcomes may come soon: handlers running, and, with
// claims, claims in flight (whose tasks will run).
func (as *attempts) busy(claims bool) int {
	as.mu.Lock()
	defer as.mu.Unlock()
	n := len(as.m) - as.writing
	if claims {
		n += as.claiming
	}
	return n
}

// ids returns the IDs of every task with an attempt in this worker.
func (as *attempts) ids() []string {
	as.mu.Lock()
	defer as.mu.Unlock()
	out := make([]string, 0, len(as.m))
	for id := range as.m {
		out = append(out, id)
	}
	return out
}

// reconciling returns the running Reconcile attempts.
func (as *attempts) reconciling() []*attempt {
	as.mu.Lock()
	defer as.mu.Unlock()
	var out []*attempt
	for _, a := range as.m {
		if a.from == StateUncertain {
			out = append(out, a)
		}
	}
	return out
}

// leased returns the attempts whose lease the heartbeat keeps: running
// and not yet settled. An attempt whose context ended (its handler was
// told to stop) keeps its lease until its transition is written: the
// task is still its own, and the fence decides the rest.
func (as *attempts) leased() []*attempt {
	as.mu.Lock()
	defer as.mu.Unlock()
	out := make([]*attempt, 0, len(as.m))
	for _, a := range as.m {
		if a.from == StateRunning && !a.settled.Load() {
			out = append(out, a)
		}
	}
	return out
}
