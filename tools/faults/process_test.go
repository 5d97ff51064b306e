//go:build faults

package faults

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/proctest"
)

// examplePkg is the service that the multi-process cases run.
const examplePkg = "github.com/idemgate/idemgate/example"

// startProc runs the example binary with args, and env added to the test
// binary's own; it is stopped when the test ends.
func startProc(t *testing.T, env []string, args ...string) *proctest.Process {
	t.Helper()
	cmd := exec.Command(proctest.Build(t, examplePkg), args...)
	cmd.Env = append(os.Environ(), env...)
	p, err := proctest.Start(t, cmd)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var listening = regexp.MustCompile(`listening on (http://\S+)`)

// startServe runs an API node (no in-process workers) and returns its URL.
func startServe(t *testing.T, env []string, extra ...string) (*proctest.Process, string) {
	t.Helper()
	args := append([]string{"serve", "-addr", "127.0.0.1:0", "-workers", "0"}, extra...)
	p := startProc(t, env, args...)
	m, err := p.WaitOutput(listening, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return p, m[1]
}

// kill SIGKILLs the process and waits for it to be gone.
func kill(t *testing.T, p *proctest.Process) {
	t.Helper()
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
}

// token mints a bearer token with the example's token command.
func token(t *testing.T, env []string, tenant, user string) string {
	t.Helper()
	cmd := exec.Command(proctest.Build(t, examplePkg), "token", "-tenant", tenant, "-user", user)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("example token: %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(lastLine(out))
}

func lastLine(b []byte) string {
	var last string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if s := strings.TrimSpace(sc.Text()); s != "" {
			last = s
		}
	}
	return last
}
