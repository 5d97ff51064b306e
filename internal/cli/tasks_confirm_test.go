package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/pgstore"
)

// tasks cancel and tasks retry change a task for good (a cancelled task
// never runs; a retried one calls its paid upstream again), so, like
// records release, they go on only on the answer "yes" at a terminal or
// with -yes; without a terminal they never read stdin. A command that
// would be refused anyway (retry of a task that has not failed) asks
// nothing and says why.
func TestTasksCancelAndRetryAskFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tests := []struct {
		name     string
		verb     string
		failed   bool // the task is failed before the command
		terminal bool
		stdin    string
		yes      bool
		json     bool
		want     pgstore.State // the task's state after the command
		wantCode int
		wantErr  string
	}{
		{name: "cancel, no terminal", verb: "cancel", stdin: "yes\n", want: pgstore.StatePending, wantCode: ExitError, wantErr: "pass -yes"},
		{name: "cancel, empty line", verb: "cancel", terminal: true, stdin: "\n", want: pgstore.StatePending, wantCode: ExitError, wantErr: "not confirmed"},
		{name: "cancel, y", verb: "cancel", terminal: true, stdin: "y\n", want: pgstore.StatePending, wantCode: ExitError, wantErr: "not confirmed"},
		{name: "cancel, end of input", verb: "cancel", terminal: true, want: pgstore.StatePending, wantCode: ExitError, wantErr: "not confirmed"},
		{name: "cancel, yes", verb: "cancel", terminal: true, stdin: "yes\n", want: pgstore.StateCancelled},
		{name: "cancel, yes, json", verb: "cancel", terminal: true, stdin: "yes\n", json: true, want: pgstore.StateCancelled},
		{name: "cancel, -yes", verb: "cancel", yes: true, want: pgstore.StateCancelled},
		{name: "retry, no terminal", verb: "retry", failed: true, want: pgstore.StateFailed, wantCode: ExitError, wantErr: "pass -yes"},
		{name: "retry, no", verb: "retry", failed: true, terminal: true, stdin: "no\n", want: pgstore.StateFailed, wantCode: ExitError, wantErr: "not confirmed"},
		{name: "retry, yes", verb: "retry", failed: true, terminal: true, stdin: "yes\n", want: pgstore.StateRetrying},
		{name: "retry, -yes", verb: "retry", failed: true, yes: true, want: pgstore.StateRetrying},
		{name: "retry of a pending task asks nothing", verb: "retry", want: pgstore.StatePending, wantCode: ExitError, wantErr: "not failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o := newOpsBench(t)
			id := o.IDs[0]
			if tt.failed {
				if _, err := o.Pool.Exec(ctx, `UPDATE idemgate_tasks SET state = 'failed', error = 'upstream refused' WHERE id = $1`, id); err != nil {
					t.Fatal(err)
				}
			}
			args := []string{"tasks", tt.verb, id}
			if tt.yes {
				args = append(args, "-yes")
			}
			if tt.json {
				args = append(args, "-json")
			}
			var stdout, stderr bytes.Buffer
			code := Main(ctx, args, Env{Prog: "idemgate", Getenv: func(k string) string {
				if k == "DATABASE_URL" {
					return o.DSN
				}
				return ""
			}, Stdin: strings.NewReader(tt.stdin), Stdout: &stdout, Stderr: &stderr, StdinIsTerminal: tt.terminal})
			task, err := o.Store.Operator().Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if code != tt.wantCode || task.State != tt.want || !strings.Contains(stderr.String(), tt.wantErr) {
				t.Fatalf("exit %d, task %s; want exit %d, task %s, stderr with %q\nstdout: %s\nstderr: %s",
					code, task.State, tt.wantCode, tt.want, tt.wantErr, stdout.String(), stderr.String())
			}
			if tt.terminal && tt.wantErr != "not failed" && !strings.Contains(stderr.String(), "Type yes") {
				t.Errorf("asked nothing: %s", stderr.String())
			}
			if tt.json && !json.Valid(stdout.Bytes()) {
				t.Errorf("-json stdout is not one JSON document:\n%s", stdout.String())
			}
		})
	}
}
