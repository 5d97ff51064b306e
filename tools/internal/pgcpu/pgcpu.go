// Package pgcpu reads the CPU time a PostgreSQL server on this machine has
// used, from /proc (Linux): the load tools divide it by the requests they
// sent to get server CPU per request.
//
// A server's CPU is the user and system time of its postmaster and of every
// live child (backends, background workers, autovacuum), plus the time of
// the children that already exited, which the kernel adds to the
// postmaster's cutime and cstime when it reaps them. Without that term a
// backend or autovacuum worker that exits between two readings would take
// its whole CPU time with it, and a difference could even turn negative.
//
// /proc reports clock ticks (USER_HZ, 100 per second on Linux), so one
// reading is exact to 10 ms per process: measure over seconds, not
// milliseconds.
package pgcpu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// userHZ is the unit of /proc/<pid>/stat's times: Linux exports them in
// USER_HZ, which is 100 on every architecture it runs on.
const userHZ = 100

// Server is a PostgreSQL server running on this machine, named by its
// postmaster's process id.
type Server struct {
	postmaster int
	proc       string // the /proc mount
}

// Querier is what Find needs of a connection: *pgx.Conn, *pgxpool.Pool and
// pgx.Tx all have it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Find returns the server that db's connection is served by. It fails when
// that server does not run on this machine (in this pid namespace): the
// backend pid that the server reports is then not a postgres process here.
func Find(ctx context.Context, db Querier) (*Server, error) {
	var backend int
	if err := db.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return nil, fmt.Errorf("pgcpu: backend pid: %w", err)
	}
	return find("/proc", backend)
}

func find(proc string, backend int) (*Server, error) {
	b, err := readStat(proc, backend)
	if err != nil {
		return nil, fmt.Errorf("pgcpu: backend %d is not a process on this machine: %w", backend, err)
	}
	if b.comm != "postgres" {
		return nil, fmt.Errorf("pgcpu: backend %d is %q here, not postgres: the server runs elsewhere", backend, b.comm)
	}
	pm, err := readStat(proc, b.ppid)
	if err != nil {
		return nil, fmt.Errorf("pgcpu: postmaster %d: %w", b.ppid, err)
	}
	if pm.comm != "postgres" {
		return nil, fmt.Errorf("pgcpu: backend %d's parent %d is %q, not the postmaster", backend, b.ppid, pm.comm)
	}
	return &Server{postmaster: b.ppid, proc: proc}, nil
}

// Postmaster returns the server's postmaster process id.
func (s *Server) Postmaster() int { return s.postmaster }

// Used returns the CPU time (user + system) the server has used so far:
// its postmaster, its live children and its reaped children. Subtract two
// readings to get the CPU time between them.
func (s *Server) Used() (time.Duration, error) {
	dirs, err := os.ReadDir(s.proc)
	if err != nil {
		return 0, fmt.Errorf("pgcpu: %w", err)
	}
	var ticks int64
	found := false
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		st, err := readStat(s.proc, pid)
		if err != nil {
			continue // exited since ReadDir
		}
		switch {
		case pid == s.postmaster:
			found = true
			ticks += st.utime + st.stime + st.cutime + st.cstime
		case st.ppid == s.postmaster:
			ticks += st.utime + st.stime
		}
	}
	if !found {
		return 0, fmt.Errorf("pgcpu: postmaster %d is gone", s.postmaster)
	}
	return time.Duration(ticks) * (time.Second / userHZ), nil
}

// stat is what Used reads of /proc/<pid>/stat; times are in clock ticks.
type stat struct {
	comm                         string
	ppid                         int
	utime, stime, cutime, cstime int64
}

func readStat(proc string, pid int) (stat, error) {
	b, err := os.ReadFile(proc + "/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return stat{}, err
	}
	return parseStat(string(b))
}

var errStat = errors.New("pgcpu: malformed /proc stat line")

// parseStat parses a /proc/<pid>/stat line: "pid (comm) state ppid …" with
// utime, stime, cutime and cstime as fields 14 to 17 (proc(5)). comm may
// hold spaces and parentheses, so it ends at the last ')'.
func parseStat(line string) (stat, error) {
	open := strings.IndexByte(line, '(')
	end := strings.LastIndexByte(line, ')')
	if open < 0 || end < open {
		return stat{}, errStat
	}
	f := strings.Fields(line[end+1:])
	// f[0] is field 3 (state): field n is f[n-3].
	if len(f) < 17-3+1 {
		return stat{}, errStat
	}
	var st stat
	st.comm = line[open+1 : end]
	var err error
	if st.ppid, err = strconv.Atoi(f[4-3]); err != nil {
		return stat{}, errStat
	}
	for i, p := range []*int64{&st.utime, &st.stime, &st.cutime, &st.cstime} {
		if *p, err = strconv.ParseInt(f[14-3+i], 10, 64); err != nil || *p < 0 {
			return stat{}, errStat
		}
	}
	return st, nil
}
