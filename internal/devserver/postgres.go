package devserver

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// pgDirs are where Debian and most distributions install server binaries.
var pgDirs = []string{"/usr/lib/postgresql/*/bin", "/usr/local/pgsql/bin"}

// Postgres is a throwaway PostgreSQL cluster with trust auth on loopback.
type Postgres struct {
	*Server
	// Port is the TCP port on 127.0.0.1.
	Port int
	// User is the superuser name.
	User string

	bin     string
	datadir string
	cred    *syscall.Credential
}

// DSN returns a connection string for database db as the superuser.
func (p *Postgres) DSN(db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", p.User, p.Port, db)
}

// StartPostgres initializes and starts a throwaway cluster (initdb, then the
// postgres server in the foreground, fsync off) on a free port. It runs the
// server as the postgres user when the process is root. The error wraps
// ErrMissing when initdb or postgres is not installed.
func StartPostgres(ctx context.Context) (*Postgres, error) {
	initdb, err := lookPath("initdb", pgDirs...)
	if err != nil {
		return nil, fmt.Errorf("%w (install the PostgreSQL server, e.g. apt-get install postgresql)", err)
	}
	// The server beside initdb (one installation), else any on the path.
	bin := filepath.Dir(initdb)
	if _, err := os.Stat(filepath.Join(bin, "postgres")); err != nil {
		postgres, err := lookPath("postgres", pgDirs...)
		if err != nil {
			return nil, err
		}
		bin = filepath.Dir(postgres)
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := makeDir("pg")
	if err != nil {
		return nil, err
	}
	p := &Postgres{bin: bin, datadir: filepath.Join(dir, "data"), cred: cred, User: "postgres"}
	if err := chownTree(dir, cred); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("devserver: chown: %w", err)
	}
	if err := initCluster(ctx, initdb, p.datadir, p.User, cred); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		srv, err := p.start(ctx, dir)
		if err == nil {
			p.Server = srv
			return p, nil
		}
		// Another process may have taken the port between probe and bind.
		if attempt == 3 || ctx.Err() != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
}

func (p *Postgres) start(ctx context.Context, dir string) (*Server, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "postgres.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("devserver: create log: %w", err)
	}
	defer logf.Close()
	if p.cred != nil {
		_ = logf.Chown(int(p.cred.Uid), int(p.cred.Gid))
	}
	cmd := p.command(port, dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	srv, err := startChild(cmd)
	if err != nil {
		return nil, fmt.Errorf("devserver: start postgres: %w", err)
	}
	srv.Dir = dir
	srv.Addr = fmt.Sprintf("127.0.0.1:%d", port)
	waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := waitPostgres(waitCtx, srv, dir, port, func() string { return tail(logPath) }); err != nil {
		_ = srv.Kill()
		return nil, err
	}
	p.Port = port
	return srv, nil
}

// command is the postgres server command line: loopback only, durability
// off (throwaway data), enough connections for many-pool tests.
func (p *Postgres) command(port int, dir string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(p.bin, "postgres"), "-D", p.datadir,
		"-p", strconv.Itoa(port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=300", "-c", "shared_buffers=128MB",
		"-c", "log_min_messages=warning")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	return cmd
}

// waitPostgres waits until the server accepts TCP connections and has
// finished startup (its pid file reports "ready").
func waitPostgres(ctx context.Context, s *Server, dir string, port int, logf func() string) error {
	if err := waitTCP(ctx, s, fmt.Sprintf("127.0.0.1:%d", port), logf); err != nil {
		return err
	}
	pidFile := filepath.Join(dir, "data", "postmaster.pid")
	for {
		if b, err := os.ReadFile(pidFile); err == nil && containsReady(b) {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("devserver: postgres exited: %v\n%s", s.waitErr, logf())
		case <-ctx.Done():
			return fmt.Errorf("devserver: postgres not ready: %w\n%s", ctx.Err(), logf())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func containsReady(pidFile []byte) bool {
	// Line 8 of postmaster.pid is the status: "ready" once connections are accepted.
	lines := 0
	start := 0
	for i, b := range pidFile {
		if b == '\n' {
			lines++
			if lines == 8 {
				return string(trimSpace(pidFile[start:i])) == "ready"
			}
			start = i + 1
		}
	}
	return false
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

// Restart stops the server with a fast shutdown and starts it again on the
// same port and data directory; for fault tests.
func (p *Postgres) Restart(ctx context.Context) error {
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	<-p.done
	logPath := filepath.Join(p.Dir, "postgres.log")
	cmd := p.command(p.Port, p.Dir)
	logf, err := os.OpenFile(logPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("devserver: open log: %w", err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	srv, err := startChild(cmd)
	if err != nil {
		return fmt.Errorf("devserver: restart postgres: %w", err)
	}
	srv.Dir, srv.Addr = p.Dir, p.Addr
	p.Server = srv
	waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return waitPostgres(waitCtx, p.Server, p.Dir, p.Port, func() string { return tail(logPath) })
}

// initArgs are initdb's arguments after -D DIR: every cluster of this
// package is made alike, so one made before can stand for a new one.
var initArgs = []string{"-A", "trust", "--no-sync", "-E", "UTF8", "--locale=C"}

// initCluster makes a new cluster in datadir, owned by cred's user: a copy
// of one that initdb made once for this machine's initdb binary and user
// (kept in the temporary directory, see pristineCluster), else initdb's
// own. initdb costs about 1.2 CPU-seconds and took 7.9 s at load 22; a
// copy of its 39 MB took 0.1 CPU-seconds and 1.1 s (7 December 2026),
// and a test run starts some twenty clusters.
func initCluster(ctx context.Context, initdb, datadir, user string, cred *syscall.Credential) error {
	if pristine, err := pristineCluster(ctx, initdb, user, cred); err == nil {
		if err := exec.CommandContext(ctx, "cp", "-a", pristine, datadir).Run(); err == nil {
			return nil
		}
		_ = os.RemoveAll(datadir) // a partial copy: initdb's own below
	}
	return runInitdb(ctx, initdb, datadir, user, cred)
}

func runInitdb(ctx context.Context, initdb, datadir, user string, cred *syscall.Credential) error {
	cmd := exec.CommandContext(ctx, initdb, append([]string{"-D", datadir, "-U", user}, initArgs...)...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("devserver: initdb: %w\n%s", err, out)
	}
	return nil
}

// pristineCluster returns the data directory of a cluster that initdb made
// and no server ever ran on, making it on the first call on this machine.
// Its name holds what made it (initdb's path, size and modification time,
// the arguments, the owner), so that a changed installation gets a new
// one. It is made in a directory of its own and renamed into place, so
// that a reader sees a whole cluster or none, and processes that race to
// make it each keep whichever rename came first.
func pristineCluster(ctx context.Context, initdb, user string, cred *syscall.Credential) (string, error) {
	fi, err := os.Stat(initdb)
	if err != nil {
		return "", err
	}
	uid := os.Geteuid()
	if cred != nil {
		uid = int(cred.Uid)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%d\x00%d\x00%s\x00%d\x00%q", initdb, fi.Size(), fi.ModTime().UnixNano(), user, uid, initArgs)
	final := filepath.Join(os.TempDir(), fmt.Sprintf("idemgate-initdb-%x", h.Sum(nil)[:8]))
	data := filepath.Join(final, "data")
	if whole(data) {
		return data, nil
	}
	tmp, err := os.MkdirTemp(os.TempDir(), "idemgate-initdb-making-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp) // what is left of it after the rename, or a loser's
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	if err := chownTree(tmp, cred); err != nil {
		return "", err
	}
	if err := runInitdb(ctx, initdb, filepath.Join(tmp, "data"), user, cred); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, final); err != nil {
		if whole(data) {
			return data, nil // another process made it first
		}
		return "", err
	}
	return data, nil
}

// whole reports whether the cluster in data has the files a server needs
// first (its version and its control file): a cleaner of the temporary
// directory may have taken some of an old one's files.
func whole(data string) bool {
	for _, f := range []string{"PG_VERSION", filepath.Join("global", "pg_control")} {
		if _, err := os.Stat(filepath.Join(data, f)); err != nil {
			return false
		}
	}
	return true
}
