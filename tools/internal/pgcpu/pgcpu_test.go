package pgcpu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// statLine formats a /proc/<pid>/stat line as Linux does (52 fields).
func statLine(pid int, comm string, ppid int, utime, stime, cutime, cstime int64) string {
	f := []string{strconv.Itoa(pid), "(" + comm + ")", "S", strconv.Itoa(ppid)}
	for n := 5; n <= 13; n++ {
		f = append(f, "0")
	}
	f = append(f, fmt.Sprint(utime), fmt.Sprint(stime), fmt.Sprint(cutime), fmt.Sprint(cstime))
	for n := 18; n <= 52; n++ {
		f = append(f, "7")
	}
	return strings.Join(f, " ") + "\n"
}

func TestParseStat(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		given   string
		want    stat
		wantErr bool
	}{
		{name: "backend", given: statLine(4242, "postgres", 4200, 150, 30, 0, 0),
			want: stat{comm: "postgres", ppid: 4200, utime: 150, stime: 30}},
		{name: "postmaster with reaped children", given: statLine(4200, "postgres", 1, 2, 3, 900, 80),
			want: stat{comm: "postgres", ppid: 1, utime: 2, stime: 3, cutime: 900, cstime: 80}},
		{name: "comm with spaces and parentheses", given: statLine(7, "a) (b c)", 3, 1, 2, 3, 4),
			want: stat{comm: "a) (b c)", ppid: 3, utime: 1, stime: 2, cutime: 3, cstime: 4}},
		{name: "real line", given: "1 (systemd) S 0 1 1 0 -1 4194560 52290 1234 85 9 120 340 56 78 20 0 1 0 4 176672768 3275 18446744073709551615 1 1 0 0 0 0 671173123 4096 1260 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
			want: stat{comm: "systemd", ppid: 0, utime: 120, stime: 340, cutime: 56, cstime: 78}},
		{name: "truncated", given: "12 (postgres) S 1 1 1 0 -1 0 0 0 0 0 5 6", wantErr: true},
		{name: "no comm", given: "12 postgres S 1", wantErr: true},
		{name: "not a number", given: strings.Replace(statLine(9, "x", 1, 1, 2, 3, 4), " 1 2 3 4 ", " 1 z 3 4 ", 1), wantErr: true},
		{name: "negative time", given: statLine(9, "x", 1, -1, 2, 3, 4), wantErr: true},
		{name: "empty", given: "", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStat(tt.given)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("parseStat(%q) = %+v, want an error", tt.given, got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("parseStat(%q) = %+v, %v; want %+v", tt.given, got, err, tt.want)
			}
		})
	}
}

func FuzzParseStat(f *testing.F) {
	f.Add("postgres", 4200, int64(150), int64(30), int64(0), int64(0))
	f.Add("a) (b c)", 1, int64(1), int64(2), int64(3), int64(4))
	f.Add("", 0, int64(0), int64(0), int64(1<<62), int64(9))
	f.Fuzz(func(t *testing.T, comm string, ppid int, u, s, cu, cs int64) {
		line := statLine(1, comm, ppid, u, s, cu, cs)
		got, err := parseStat(line)
		if err != nil {
			// Only negative times are refused: comm may hold anything,
			// since the fields start after its last ')'.
			if u >= 0 && s >= 0 && cu >= 0 && cs >= 0 {
				t.Fatalf("parseStat(%q): %v", line, err)
			}
			return
		}
		want := stat{comm: comm, ppid: ppid, utime: u, stime: s, cutime: cu, cstime: cs}
		if got != want {
			t.Fatalf("parseStat(%q) = %+v, want %+v", line, got, want)
		}
	})
}

// FuzzParseStatAny: no input panics, and a parsed line has no negative time.
func FuzzParseStatAny(f *testing.F) {
	f.Add(statLine(4242, "postgres", 4200, 150, 30, 0, 0))
	f.Add("1 (x) S")
	f.Add(")(")
	f.Fuzz(func(t *testing.T, line string) {
		st, err := parseStat(line)
		if err == nil && (st.utime < 0 || st.stime < 0 || st.cutime < 0 || st.cstime < 0) {
			t.Fatalf("parseStat(%q) = %+v: negative time", line, st)
		}
	})
}

// fakeProc writes stat files under a directory laid out like /proc.
func fakeProc(t *testing.T, lines map[int]string) string {
	t.Helper()
	dir := t.TempDir()
	for pid, line := range lines {
		if err := os.MkdirAll(filepath.Join(dir, strconv.Itoa(pid)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(pid), "stat"), []byte(line), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "loadavg"), []byte("0.1 0.2 0.3 1/2 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestUsedSumsTheServerTree: the postmaster's own and reaped children's
// time, its live children's time, nothing of other processes.
func TestUsedSumsTheServerTree(t *testing.T) {
	t.Parallel()
	proc := fakeProc(t, map[int]string{
		1:   statLine(1, "init", 0, 5000, 5000, 90000, 90000),
		100: statLine(100, "postgres", 1, 10, 20, 300, 40), // postmaster: 10+20 own, 300+40 reaped
		101: statLine(101, "postgres", 100, 1000, 200, 0, 0),
		102: statLine(102, "postgres", 100, 7, 3, 55, 55), // a child's own cutime is not ours
		103: statLine(103, "bash", 1, 777, 777, 0, 0),
		104: statLine(104, "postgres", 103, 888, 0, 0, 0), // another server's backend
	})
	s, err := find(proc, 101)
	if err != nil {
		t.Fatal(err)
	}
	if s.Postmaster() != 100 {
		t.Fatalf("postmaster %d, want 100", s.Postmaster())
	}
	got, err := s.Used()
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Duration(10+20+300+40+1000+200+7+3) * 10 * time.Millisecond; got != want {
		t.Errorf("Used = %v, want %v", got, want)
	}
}

func TestFindRefusesAServerElsewhere(t *testing.T) {
	t.Parallel()
	proc := fakeProc(t, map[int]string{
		50: statLine(50, "bash", 1, 0, 0, 0, 0),
		60: statLine(60, "postgres", 50, 0, 0, 0, 0),
	})
	tests := []struct {
		name    string
		backend int
	}{
		{"no such process", 4242},
		{"another program", 50},
		{"parent is not postgres", 60},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if s, err := find(proc, tt.backend); err == nil {
				t.Errorf("find(%d) = postmaster %d, want an error", tt.backend, s.Postmaster())
			}
		})
	}
}

// TestUsedKeepsExitedBackends: a backend that burns CPU and then exits
// still counts, through the postmaster's cutime/cstime once reaped.
func TestUsedKeepsExitedBackends(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Find(ctx, conn)
	if err != nil {
		conn.Close(ctx)
		t.Skipf("server not on this machine: %v", err)
	}
	var backend int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		t.Fatal(err)
	}
	own := func() int64 {
		st, err := readStat("/proc", backend)
		if err != nil {
			t.Fatal(err)
		}
		return st.utime + st.stime
	}
	before, err := s.Used()
	if err != nil {
		t.Fatal(err)
	}
	own0 := own()
	if _, err := conn.Exec(ctx, `SELECT sum(i) FROM generate_series(1, 3000000) AS i`); err != nil {
		t.Fatal(err)
	}
	burned := time.Duration(own()-own0) * 10 * time.Millisecond
	if burned == 0 {
		t.Fatal("the backend used no measurable CPU")
	}
	if err := conn.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// Wait until the postmaster has reaped the backend (a zombie keeps its
	// /proc entry until then).
	for {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", backend)); os.IsNotExist(err) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("backend %d did not exit", backend)
		case <-time.After(10 * time.Millisecond):
		}
	}
	after, err := s.Used()
	if err != nil {
		t.Fatal(err)
	}
	if after-before < burned {
		t.Errorf("Used grew by %v over a backend that burned %v and exited: its time was lost", after-before, burned)
	}
}
