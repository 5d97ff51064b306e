// Package devserver starts throwaway PostgreSQL and Redis servers on free
// loopback ports for tests and for the example service's embedded defaults.
//
// Every server runs as a child process that the kernel kills when the
// starting process dies (Pdeathsig), so a panicking test binary or a crashed
// example leaves no server behind. Each server's files live in a directory
// named idemgate-dev-* under the system temp dir, with an owner file holding
// the starting process's pid; Start* functions first remove such directories
// whose owner is gone, which cleans up after a crash at the next start.
package devserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrMissing reports that a server binary is not installed on this machine.
var ErrMissing = errors.New("devserver: server binary not found")

const dirPrefix = "idemgate-dev-"

// Server is one running throwaway server. Stop it when done; Stop is safe
// to call more than once.
type Server struct {
	// Addr is host:port of the server.
	Addr string
	// Dir holds the server's files and is removed by Stop.
	Dir string

	cmd      *exec.Cmd
	done     chan struct{}
	waitErr  error
	stopOnce sync.Once
}

// Stop terminates the server, waits for it to exit and removes its files.
func (s *Server) Stop() error {
	var err error
	s.stopOnce.Do(func() {
		if s.cmd != nil && s.cmd.Process != nil {
			// SIGINT is PostgreSQL's fast shutdown and a clean exit for redis-server.
			_ = s.cmd.Process.Signal(syscall.SIGINT)
			select {
			case <-s.done:
			case <-time.After(10 * time.Second):
				_ = s.cmd.Process.Kill()
				<-s.done
			}
		}
		err = os.RemoveAll(s.Dir)
	})
	return err
}

// Kill stops the server abruptly (SIGKILL), leaving its files; for fault tests.
func (s *Server) Kill() error {
	if s.cmd == nil || s.cmd.Process == nil {
		return nil
	}
	err := s.cmd.Process.Kill()
	<-s.done
	return err
}

// Exited is closed when the server process has exited.
func (s *Server) Exited() <-chan struct{} { return s.done }

// StartChild starts cmd so that the child dies with this process: the
// kernel sends it SIGKILL (Pdeathsig) when the thread that forked it exits,
// so every child is forked from one OS thread that is locked for the life
// of the process. Other fields of cmd.SysProcAttr are kept. As with
// cmd.Start, the caller must Wait for cmd.
//
// A program's own children that must not outlive it (servers, test
// processes, soak nodes) start here; Pdeathsig is Linux-only.
func StartChild(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	var err error
	forker.run(func() { err = cmd.Start() })
	return err
}

// starter runs functions on one OS thread that never exits: the Go
// runtime may otherwise retire the thread that forked a child, which would
// fire the child's Pdeathsig.
type starter struct {
	once sync.Once
	reqs chan func()
}

// forker is the starter of this process's children. A package-level value
// is the one exception to "no globals": the thread belongs to the process.
var forker starter

func (st *starter) run(f func()) {
	st.once.Do(func() {
		st.reqs = make(chan func())
		go func() {
			runtime.LockOSThread()
			for f := range st.reqs {
				f()
			}
		}()
	})
	done := make(chan struct{})
	st.reqs <- func() { f(); close(done) }
	<-done
}

// startChild starts a server that dies with this process, in a process
// group of its own: a terminal's Ctrl-C reaches only the program that
// started it, which then stops the server in order.
func startChild(cmd *exec.Cmd) (*Server, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if err := StartChild(cmd); err != nil {
		return nil, err
	}
	s := &Server{cmd: cmd, done: make(chan struct{})}
	go func() {
		s.waitErr = cmd.Wait()
		close(s.done)
	}()
	return s, nil
}

// makeDir creates a fresh owned directory and sweeps those of dead owners.
func makeDir(kind string) (string, error) {
	sweep()
	dir, err := os.MkdirTemp("", dirPrefix+kind+"-")
	if err != nil {
		return "", fmt.Errorf("devserver: make dir: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", fmt.Errorf("devserver: chmod dir: %w", err)
	}
	owner := strconv.Itoa(os.Getpid())
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(owner), 0o644); err != nil {
		return "", fmt.Errorf("devserver: write owner: %w", err)
	}
	return dir, nil
}

// sweep removes server dirs whose owning process no longer exists.
func sweep() {
	matches, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range matches {
		b, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(dir)
		}
	}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago,
// below the kernel's ephemeral range when there is room there. A server
// that is killed and started again on its port (the fault tests, the
// chaos soak) must find it free: a port of the ephemeral range (what
// listening on port 0 gives) can meanwhile be the local end of any
// outgoing connection on the machine, and the restart then fails with
// "address already in use".
func FreePort() (int, error) {
	if lo := ephemeralLow(); lo > 2048 {
		base := max(1024, lo-16384)
		for range 64 {
			port := base + rand.IntN(lo-base)
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
			if err == nil {
				l.Close()
				return port, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("devserver: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralLow returns the first port of the kernel's ephemeral range
// (Linux), 0 when unknown.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return lo
}

// waitTCP dials addr until it answers, the server exits or ctx ends.
func waitTCP(ctx context.Context, s *Server, addr string, logf func() string) error {
	return waitUntil(ctx, s, addr, "not up", logf, func() bool {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
}

// waitUntil polls ready every 20 ms until it reports true, the server s
// on addr exits or ctx ends; the error then says what (notYet on ctx's
// end) and carries the server's log. A ready answer from addr after s has
// exited is another process's: s has not started.
func waitUntil(ctx context.Context, s *Server, addr, notYet string, logf func() string, ready func() bool) error {
	for {
		ok := ready()
		select {
		case <-s.done:
			return fmt.Errorf("devserver: server on %s exited: %v\n%s", addr, s.waitErr, logf())
		default:
		}
		if ok {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("devserver: server on %s exited: %v\n%s", addr, s.waitErr, logf())
		case <-ctx.Done():
			return fmt.Errorf("devserver: server on %s %s: %w\n%s", addr, notYet, ctx.Err(), logf())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// lookPath finds name on PATH or in dirs.
func lookPath(name string, dirs ...string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, pattern := range dirs {
		matches, _ := filepath.Glob(filepath.Join(pattern, name))
		// Highest version last in lexical order for single-digit majors; pick the last.
		if len(matches) > 0 {
			return matches[len(matches)-1], nil
		}
	}
	return "", fmt.Errorf("%w: %s", ErrMissing, name)
}

// tail returns the last lines of a log file, for error messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// credential returns the credential to run PostgreSQL with: the postgres
// user when running as root (PostgreSQL refuses root), else nil.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("devserver: running as root needs a 'postgres' user to run PostgreSQL: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func chownTree(dir string, cred *syscall.Credential) error {
	if cred == nil {
		return nil
	}
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(cred.Uid), int(cred.Gid))
	})
}
