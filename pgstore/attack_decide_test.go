package pgstore

import (
	"encoding/json"
	"errors"
	"testing"
)

// A Reconcile that answers just as shutdown cancels it has found out what
// became of the task: its Succeeded or Failed is recorded (the reconcile's
// claim still fences the write), not dropped as if a release had written
// it. Nothing released an uncertain task. A running attempt's release did
// write its transition: that stays.
func TestAttackReconcileAnswerAtShutdownCounts(t *testing.T) {
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
		{from: StateRunning, end: endReleased, returned: true, outcome: ok, cause: errShutdown},
	} {
		if tr := decide(v); tr.write != writeNone {
			t.Errorf("%+v: %+v; want nothing written", v, tr)
		}
	}
}
