package proctest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/devserver"
)

const (
	// stopBound is how long a child may take to exit on SIGTERM at the
	// end of its test before it gets SIGKILL.
	stopBound = 15 * time.Second
	// killBound is how long a child may take to be gone after SIGKILL.
	killBound = 10 * time.Second
)

// Process is a running child process started by Start.
type Process struct {
	name string // command line and pid, for messages
	cmd  *exec.Cmd
	out  output
	done chan struct{}
	err  error // cmd.Wait's; set before done is closed
}

// Start starts cmd as a child of the test binary, with its stdout and
// stderr (replacing cmd's own) going to one buffer that Output and
// WaitOutput read. The child is stopped when t ends, as the package doc
// says. Start does not fail the test; it may be called from any goroutine.
func Start(t testing.TB, cmd *exec.Cmd) (*Process, error) {
	p := &Process{cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	line := commandLine(cmd)
	if err := devserver.StartChild(cmd); err != nil {
		return nil, fmt.Errorf("proctest: start %s: %w", line, err)
	}
	p.name = fmt.Sprintf("%s (pid %d)", line, cmd.Process.Pid)
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("output of %s:\n%s", p.name, p.Output())
		}
	})
	return p, nil
}

func commandLine(cmd *exec.Cmd) string {
	args := append([]string{filepath.Base(cmd.Path)}, cmd.Args[1:]...)
	return strings.Join(args, " ")
}

// stop ends the child: SIGCONT first, since a stopped process acts on no
// SIGTERM, and SIGKILL if SIGTERM is not enough within stopBound.
func (p *Process) stop() {
	_ = p.Signal(syscall.SIGCONT)
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopBound):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Output returns what the child has written to stdout and stderr so far.
func (p *Process) Output() string { return p.out.String() }

// Exited is closed when the child has exited and its output is complete.
func (p *Process) Exited() <-chan struct{} { return p.done }

// Signal sends sig to the child; the error wraps os.ErrProcessDone if the
// child has exited.
func (p *Process) Signal(sig os.Signal) error {
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("proctest: signal %s: %w", p.name, err)
	}
	return nil
}

// Kill sends SIGKILL and waits until the child is gone.
func (p *Process) Kill() error {
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("proctest: kill %s: %w", p.name, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(killBound):
		return fmt.Errorf("proctest: %s still there %v after SIGKILL", p.name, killBound)
	}
}

// Wait waits for the child to exit and returns its exit error (an
// *exec.ExitError for a non-zero status), or an error if it still runs
// after within.
func (p *Process) Wait(within time.Duration) error {
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case <-p.done:
		if p.err != nil {
			return fmt.Errorf("proctest: %s: %w", p.name, p.err)
		}
		return nil
	case <-timer.C:
		return fmt.Errorf("proctest: %s still running after %v", p.name, within)
	}
}

// WaitOutput waits until the child has written a line matching re and
// returns re's submatches in it, as regexp.FindStringSubmatch does. A line
// counts once it ends, or once the child has exited. It fails if the child
// exits first or no line matches within the bound; the error holds the
// output.
func (p *Process) WaitOutput(re *regexp.Regexp, within time.Duration) ([]string, error) {
	timer := time.NewTimer(within)
	defer timer.Stop()
	from := 0 // the first line not yet matched
	for {
		var exited bool
		select {
		case <-p.done:
			exited = true
		default:
		}
		out, grew := p.out.snapshot()
		var m []string
		if m, from = matchLine(re, out, from, exited); m != nil {
			return m, nil
		}
		if exited {
			return nil, fmt.Errorf("proctest: %s exited (%v) before a line matching %q:\n%s", p.name, p.err, re, out)
		}
		select {
		case <-grew:
		case <-p.done:
		case <-timer.C:
			return nil, fmt.Errorf("proctest: %s wrote no line matching %q within %v:\n%s", p.name, re, within, out)
		}
	}
}

// matchLine matches re against the lines of out from offset from on, the
// unterminated last one too if final. It returns the submatches of the
// first matching line, and the offset of the first line it did not try.
func matchLine(re *regexp.Regexp, out string, from int, final bool) ([]string, int) {
	for {
		n := strings.IndexByte(out[from:], '\n')
		if n < 0 {
			break
		}
		line := out[from : from+n]
		from += n + 1
		if m := re.FindStringSubmatch(line); m != nil {
			return m, from
		}
	}
	if final && from < len(out) {
		if m := re.FindStringSubmatch(out[from:]); m != nil {
			return m, len(out)
		}
	}
	return nil, from
}

// output is a child's stdout and stderr, safe for the goroutine that
// copies them and the ones that read.
type output struct {
	mu   sync.Mutex
	b    bytes.Buffer
	grew chan struct{} // closed by the next Write; nil until someone waits
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.grew != nil {
		close(o.grew)
		o.grew = nil
	}
	return o.b.Write(p)
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// snapshot returns the output so far and a channel closed when it grows.
func (o *output) snapshot() (string, <-chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.grew == nil {
		o.grew = make(chan struct{})
	}
	return o.b.String(), o.grew
}
