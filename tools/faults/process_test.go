//go:build faults

package faults

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// binaryCache builds the example service once per test binary.
type binaryCache struct {
	once sync.Once
	dir  string
	path string
	err  error
	out  []byte
}

// binaries is the example binary of this test binary: one build, shared by
// the multi-process cases, removed when TestMain returns.
var binaries binaryCache

func (b *binaryCache) example(t *testing.T) string {
	t.Helper()
	b.once.Do(func() {
		b.dir, b.err = os.MkdirTemp("", "idemgate-faults-")
		if b.err != nil {
			return
		}
		b.path = filepath.Join(b.dir, "example")
		cmd := exec.Command("go", "build", "-o", b.path, "github.com/idemgate/idemgate/example")
		b.out, b.err = cmd.CombinedOutput()
	})
	if b.err != nil {
		t.Fatalf("go build ./example: %v\n%s", b.err, b.out)
	}
	return b.path
}

func (b *binaryCache) cleanup() {
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}

// proc is a running example process.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startProc runs the example binary with args and env; it is killed when
// the test ends (and, by Pdeathsig, when the test binary dies).
func startProc(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(binaries.example(t), args...)
	cmd.Env = append(os.Environ(), env...)
	p := &proc{name: name, cmd: cmd, out: &lockedBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.signal(syscall.SIGCONT)
		p.signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("output of %s:\n%s", name, p.out.String())
		}
	})
	return p
}

func (p *proc) signal(sig syscall.Signal) {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(sig)
	}
}

// kill SIGKILLs the process and waits for it to be gone.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	p.signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not die after SIGKILL", p.name)
	}
}

// waitOutput waits until the process printed a line matching re and
// returns the first submatch (or the whole match).
func (p *proc) waitOutput(t *testing.T, re *regexp.Regexp, within time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if m := re.FindStringSubmatch(p.out.String()); m != nil {
			return m[len(m)-1]
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited before printing %v:\n%s", p.name, re, p.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not print %v within %v:\n%s", p.name, re, within, p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var listening = regexp.MustCompile(`listening on (http://\S+)`)

// startServe runs an API node (no in-process workers) and returns its URL.
func startServe(t *testing.T, name string, env []string, extra ...string) (*proc, string) {
	t.Helper()
	args := append([]string{"serve", "-addr", "127.0.0.1:0", "-workers", "0"}, extra...)
	p := startProc(t, name, env, args...)
	return p, p.waitOutput(t, listening, 60*time.Second)
}

// token mints a bearer token with the example's token command.
func token(t *testing.T, env []string, tenant, user string) string {
	t.Helper()
	cmd := exec.Command(binaries.example(t), "token", "-tenant", tenant, "-user", user)
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

// runToExit runs the example binary to completion.
func runToExit(ctx context.Context, t *testing.T, env []string, stdout io.Writer, args ...string) error {
	t.Helper()
	cmd := exec.CommandContext(ctx, binaries.example(t), args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = stdout, stdout
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("example %s: %w", strings.Join(args, " "), err)
	}
	return nil
}
