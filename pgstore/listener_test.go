package pgstore

import (
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/wait"
)

// listenerWake is one call of a listener's wake: when, and whether its
// recheck timer made it (the others come from listenOnce itself, on LISTEN
// and on a notification). A recheck's wake-up waits in release until the
// test lets it through.
type listenerWake struct {
	at      time.Time
	recheck bool
	release chan struct{}
}

// watchWakes wraps l.wake, before the listener runs, so that each call is
// sent on the returned channel; a recheck's call goes on to the worker only
// once the test closes its release (or the test ends).
func watchWakes(t *testing.T, l *listener) <-chan listenerWake {
	t.Helper()
	wakes := make(chan listenerWake, 64)
	ended := make(chan struct{})
	t.Cleanup(func() { close(ended) })
	wake := l.wake
	l.wake = func() {
		e := listenerWake{at: time.Now(), recheck: !calledFromListenOnce()}
		if e.recheck {
			e.release = make(chan struct{})
		}
		select {
		case wakes <- e:
		case <-ended:
			return
		}
		if e.recheck {
			select {
			case <-e.release:
			case <-ended:
				return
			}
		}
		wake()
	}
	return wakes
}

// calledFromListenOnce reports whether (*listener).listenOnce is on the
// caller's stack; the recheck timer calls wake on a goroutine of its own.
func calledFromListenOnce() bool {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	for {
		f, more := frames.Next()
		if strings.HasSuffix(f.Function, ".(*listener).listenOnce") {
			return true
		}
		if !more {
			return false
		}
	}
}

// A task announced by no NOTIFY of its own (its Submit fell in a burst's
// rate-limit window) is claimed a recheck window after the burst's last
// notification, not at the next poll: the recheck timer restarts with
// every notification. The moments are made, not slept for: the test sees
// each wake-up as the listener makes it, inserts the quiet task after the
// last notification's, and holds the recheck's wake-up until the task is
// in the table. Only the recheck's time is a verdict, and a timer never
// fires early: one that did not restart fires a window after the first
// notification, before a window after the last.
func TestNoLostWakeUpAfterABurst(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	w := newWorker(t, s, WorkerConfig{PollInterval: time.Hour, Handler: func(context.Context, Task) Outcome {
		return Succeeded(json.RawMessage(`1`))
	}})
	const window = 2 * time.Second
	w.listener.recheck = window
	wakes := watchWakes(t, w.listener)
	runWorker(t, w)
	next := func(what string) listenerWake {
		t.Helper()
		select {
		case e := <-wakes:
			return e
		case <-time.After(patience):
			t.Fatalf("not within %v: %s", patience, what)
			return listenerWake{}
		}
	}
	if e := next("the listener's wake-up on LISTEN"); e.recheck {
		t.Fatal("the wake-up on LISTEN did not come from listenOnce: the test cannot tell a notification's wake-up from the recheck's")
	}
	wait.For(t, patience, "the worker listens and is idle", func() bool {
		return countActivity(t, s.pool, listening) == 1 && w.claims.Load() >= 2
	})
	ctx := context.Background()
	notify := func() {
		t.Helper()
		if _, err := s.pool.Exec(ctx, "SELECT pg_notify($1, 'image')", notifyChannel); err != nil {
			t.Fatal(err)
		}
	}
	// The burst: two notifications a quarter of a window apart. If the
	// machine stalls so long that the first one's recheck comes between
	// them, the burst shows nothing and is sent again.
	var last listenerWake
	for deadline := time.Now().Add(patience); ; {
		notify()
		first := next("the wake-up on the burst's first notification")
		time.Sleep(window / 4)
		notify()
		last = next("the wake-up on the burst's last notification")
		if !first.recheck && !last.recheck {
			break
		}
		for _, e := range []listenerWake{first, last} {
			if e.recheck {
				close(e.release)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: a burst of two notifications %v apart with no recheck between them (the last attempt's wake-ups: recheck %v, %v)",
				patience, window/4, first.recheck, last.recheck)
		}
		t.Logf("a recheck came within the burst (the machine stalled for a window); again")
	}
	var id string
	if err := s.pool.QueryRow(ctx, `INSERT INTO idemgate_tasks
		(tenant, owner, kind, runtime, network, idempotency_key, fingerprint)
		VALUES ('acme', 'o', 'image', 'gpu', 'main', 'quiet', 'f') RETURNING id::text`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	recheck := next("the recheck after the burst (the poll interval is an hour)")
	if !recheck.recheck {
		t.Fatalf("after the burst's last notification came another notification's wake-up, not the recheck's")
	}
	if gap := recheck.at.Sub(last.at); gap < window {
		t.Errorf("the recheck came %v after the burst's last notification, less than its %v window: the timer did not restart on it", gap, window)
	}
	close(recheck.release)
	// The recheck woke the worker after the quiet task was in the table.
	waitState(t, s, id, StateSucceeded)
}
