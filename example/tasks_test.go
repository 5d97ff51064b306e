package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/internal/opsbench"
	"github.com/idemgate/idemgate/internal/testenv"
)

// The example's tasks commands are the idemgate command's (internal/cli
// tests them); these check the wiring: exit codes, output and the
// environment reach the shared code.
func TestTasksRunsTheSharedCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.PostgresDSN(t)
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return dsn
		}
		return ""
	}
	tasks := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := run(ctx, append([]string{"tasks"}, args...), getenv, &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	// Never migrates: an empty database is refused, and stays empty.
	if code, _, errOut := tasks("list"); code != 1 || !strings.Contains(errOut, "no pgstore tables") {
		t.Fatalf("tasks list on an empty database: exit %d, %q", code, errOut)
	}
	task := opsbench.Seed(t, dsn, taskRuntime, taskNetwork).IDs[0]
	if code, out, errOut := tasks("-json", "show", task); code != 0 || !strings.Contains(out, task) || !json.Valid([]byte(out)) {
		t.Fatalf("tasks -json show: exit %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := tasks("pause", "imgaes"); code != 1 || !strings.Contains(errOut, "-new-kind") {
		t.Fatalf("tasks pause of a typo: exit %d, %q", code, errOut)
	}
	if code, _, errOut := tasks("purge"); code != 2 || !strings.Contains(errOut, "go run ./example tasks") {
		t.Fatalf("tasks purge: exit %d, %q", code, errOut)
	}
}

// newOpsBench is a migrated database with tasks of two tenants (the
// queue route's tests use it).
func newOpsBench(t *testing.T) *opsbench.Bench {
	t.Helper()
	return opsbench.Seed(t, testenv.PostgresDSN(t), taskRuntime, taskNetwork)
}
