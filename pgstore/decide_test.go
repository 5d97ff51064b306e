package pgstore

import (
	"encoding/json"
	"errors"
	"testing"
	"time"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	img := json.RawMessage(`"img"`)
	boom := errors.New("boom")
	tests := []struct {
		name  string
		given verdict
		want  transition
	}{
		// From running: what the handler returned.
		{name: "success", given: verdict{from: StateRunning, returned: true, outcome: Succeeded(img)},
			want: transition{write: writeFinish, to: StateSucceeded, results: []byte(`["img"]`), event: WorkerSucceeded}},
		{name: "success without a real item fails", given: verdict{from: StateRunning, returned: true, outcome: Succeeded(json.RawMessage("null"), nil)},
			want: transition{write: writeFinish, to: StateFailed, results: []byte(`[null,null]`), err: "no result items", event: WorkerFailed}},
		{name: "results that are not JSON", given: verdict{from: StateRunning, returned: true, outcome: Succeeded(json.RawMessage("{"))},
			want: transition{write: writeFinish, to: StateFailed, results: []byte(`[]`), err: "handler returned results that are not JSON", event: WorkerFailed}},
		{name: "success with a NUL escape is stored sanitized", given: verdict{from: StateRunning, returned: true, outcome: Succeeded(json.RawMessage(`"a\u0000"`))},
			want: transition{write: writeFinish, to: StateSucceeded, results: []byte(`["a\ufffd"]`), event: WorkerSucceeded}},
		{name: "failure keeps partial results", given: verdict{from: StateRunning, returned: true, outcome: Failed(boom, img)},
			want: transition{write: writeFinish, to: StateFailed, results: []byte(`["img"]`), err: "boom", event: WorkerFailed}},
		{name: "failure without an error", given: verdict{from: StateRunning, returned: true, outcome: Failed(nil)},
			want: transition{write: writeFinish, to: StateFailed, results: []byte(`[]`), err: "task failed", event: WorkerFailed}},
		{name: "failure text with NUL", given: verdict{from: StateRunning, returned: true, outcome: Failed(errors.New("a\x00b"))},
			want: transition{write: writeFinish, to: StateFailed, results: []byte(`[]`), err: "a\uFFFDb", event: WorkerFailed}},
		{name: "zero outcome fails", given: verdict{from: StateRunning, returned: true},
			want: transition{write: writeFinish, to: StateFailed, results: []byte(`[]`), err: "handler returned no outcome", event: WorkerFailed}},
		{name: "retry after a delay", given: verdict{from: StateRunning, returned: true, outcome: Retry(time.Minute, boom)},
			want: transition{write: writeRetry, err: "boom", after: time.Minute, event: WorkerRetried}},
		{name: "retry with backoff", given: verdict{from: StateRunning, returned: true, outcome: Retry(0, nil)},
			want: transition{write: writeRetry, err: "retry", after: -1, event: WorkerRetried}},
		{name: "uncertain", given: verdict{from: StateRunning, returned: true, outcome: Uncertain(boom)},
			want: transition{write: writeUncertain, err: "boom", event: WorkerUncertain}},

		// From running: the attempt ended without a final outcome.
		{name: "panic retries by default", given: verdict{from: StateRunning, end: endPanicked, cause: boom, lost: LostRetry},
			want: transition{write: writeRetry, err: "handler panic: boom", after: -1, event: WorkerRetried}},
		{name: "panic of an uncertain-policy kind", given: verdict{from: StateRunning, end: endPanicked, cause: boom, lost: LostUncertain},
			want: transition{write: writeUncertain, err: "handler panic: boom: the upstream outcome is unknown", event: WorkerUncertain}},
		{name: "timeout retries", given: verdict{from: StateRunning, end: endTimedOut, lost: LostRetry},
			want: transition{write: writeRetry, err: "attempt timed out", after: -1, event: WorkerTimedOut}},
		{name: "timeout of an uncertain-policy kind", given: verdict{from: StateRunning, end: endTimedOut, lost: LostUncertain},
			want: transition{write: writeUncertain, err: "attempt timed out: the upstream outcome is unknown", event: WorkerTimedOut}},
		{name: "a Retry returned after a timeout follows the policy", given: verdict{from: StateRunning, end: endTimedOut, returned: true, outcome: Retry(0, boom), lost: LostUncertain},
			want: transition{write: writeUncertain, err: "attempt timed out: the upstream outcome is unknown", event: WorkerTimedOut}},
		{name: "a success returned after a timeout counts", given: verdict{from: StateRunning, end: endTimedOut, returned: true, outcome: Succeeded(img), lost: LostUncertain},
			want: transition{write: writeFinish, to: StateSucceeded, results: []byte(`["img"]`), event: WorkerSucceeded}},
		{name: "lost lease, retry policy", given: verdict{from: StateRunning, end: endLeaseLost, cause: errLeaseExpired, returned: true, outcome: Retry(0, boom), lost: LostRetry},
			want: transition{write: writeRetry, err: "attempt lost: " + errLeaseExpired.Error(), after: -1, event: WorkerRetried}},
		{name: "lost lease, uncertain policy", given: verdict{from: StateRunning, end: endLeaseLost, cause: errLeaseExpired, lost: LostUncertain},
			want: transition{write: writeUncertain, err: "attempt lost: " + errLeaseExpired.Error() + ": the upstream outcome is unknown", event: WorkerUncertain}},
		{name: "cancelled ends cancelled, whatever it returned", given: verdict{from: StateRunning, end: endCancelled, returned: true, outcome: Succeeded(img)},
			want: transition{write: writeCancelled, event: WorkerCancelled}},
		{name: "released is handed back once the handler returned", given: verdict{from: StateRunning, end: endReleased, returned: true, outcome: Retry(0, boom)},
			want: transition{write: writeRelease, event: WorkerRetried}},
		{name: "released is handed back whatever it returned", given: verdict{from: StateRunning, end: endReleased, returned: true, outcome: Succeeded(img)},
			want: transition{write: writeRelease, event: WorkerRetried}},

		// From uncertain (Reconcile): only an explicit decision moves it.
		{name: "reconciled success", given: verdict{from: StateUncertain, returned: true, outcome: Succeeded(img)},
			want: transition{write: writeFinish, to: StateSucceeded, results: []byte(`["img"]`), event: WorkerReconciled}},
		{name: "reconciled failure", given: verdict{from: StateUncertain, returned: true, outcome: Failed(boom)},
			want: transition{write: writeFinish, to: StateFailed, results: []byte(`[]`), err: "boom", event: WorkerReconciled}},
		{name: "reconcile says run it again", given: verdict{from: StateUncertain, returned: true, outcome: Retry(0, boom)},
			want: transition{write: writeRetry, err: "boom", after: -1, event: WorkerReconciled}},
		{name: "reconcile asks again later", given: verdict{from: StateUncertain, returned: true, outcome: Uncertain(boom)},
			want: transition{write: writeUncertain, err: "boom", event: WorkerUncertain}},
		{name: "reconcile panic stays uncertain", given: verdict{from: StateUncertain, end: endPanicked, cause: boom, lost: LostRetry},
			want: transition{write: writeUncertain, err: "reconcile: handler panic: boom", event: WorkerUncertain}},
		{name: "reconcile zero outcome stays uncertain", given: verdict{from: StateUncertain, returned: true},
			want: transition{write: writeUncertain, err: "reconcile: returned no outcome", event: WorkerUncertain}},
		{name: "reconcile out of time stays uncertain", given: verdict{from: StateUncertain, end: endLeaseLost, cause: errLeaseExpired, returned: true, outcome: Retry(0, boom)},
			want: transition{write: writeUncertain, err: "reconcile: attempt lost: " + errLeaseExpired.Error(), event: WorkerUncertain}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := decide(tt.given)
			if got.write != tt.want.write || got.to != tt.want.to || string(got.results) != string(tt.want.results) ||
				got.err != tt.want.err || got.after != tt.want.after || got.event != tt.want.event {
				t.Fatalf("decide(%+v)\n got %+v (results %s)\nwant %+v (results %s)", tt.given, got, got.results, tt.want, tt.want.results)
			}
		})
	}
}

// A Reconcile that answers just as shutdown cancels it has found out what
// became of the task: its Succeeded or Failed is recorded (the reconcile's
// claim still fences the write), not dropped as if a release had written
// it. Nothing released an uncertain task. A running attempt's release did
// write its transition: that stays.
func TestReconcileAnswerAtShutdownCounts(t *testing.T) {
	ok := Succeeded(json.RawMessage(`"img"`))
	tr := decide(verdict{from: StateUncertain, end: endReleased, returned: true, outcome: ok, cause: errShutdown, lost: LostUncertain})
	if tr.write != writeFinish || tr.to != StateSucceeded || tr.event != WorkerReconciled {
		t.Fatalf("reconcile answered Succeeded at shutdown: %+v; want it recorded", tr)
	}
	tr = decide(verdict{from: StateUncertain, end: endReleased, returned: true, outcome: Failed(errors.New("refused")), cause: errShutdown})
	if tr.write != writeFinish || tr.to != StateFailed {
		t.Fatalf("reconcile answered Failed at shutdown: %+v; want it recorded", tr)
	}
	// Without an answer, or a non-final one, the task stays as it is.
	for _, v := range []verdict{
		{from: StateUncertain, end: endReleased, returned: false, cause: errShutdown},
		{from: StateUncertain, end: endReleased, returned: true, outcome: Retry(0, nil), cause: errShutdown},
	} {
		if tr := decide(v); tr.write != writeNone {
			t.Errorf("%+v: %+v; want nothing written", v, tr)
		}
	}
}
