package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of /proc/*/stat CPU times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// serverCPU returns a function that reads the CPU time the PostgreSQL
// server with data directory datadir has used so far: the postmaster's,
// its exited children's, and its running children's (the backends). It
// returns nil when that cannot be read (no /proc, or not our server).
func serverCPU(datadir string) func() time.Duration {
	b, err := os.ReadFile(filepath.Join(datadir, "postmaster.pid"))
	if err != nil {
		return nil
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		return nil
	}
	if _, ok := procStat(pid); !ok {
		return nil
	}
	return func() time.Duration {
		self, _ := procStat(pid)
		total := self.utime + self.stime + self.cutime + self.cstime
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			child, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if st, ok := procStat(child); ok && st.ppid == pid {
				total += st.utime + st.stime
			}
		}
		return time.Duration(total) * clockTick
	}
}

// stat is the part of /proc/PID/stat that serverCPU needs.
type stat struct {
	ppid                         int
	utime, stime, cutime, cstime int64
}

func procStat(pid int) (stat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return stat{}, false
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return stat{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): ppid is field 4, utime..cstime 14..17.
	if len(f) < 15 {
		return stat{}, false
	}
	var st stat
	st.ppid, _ = strconv.Atoi(f[1])
	st.utime, _ = strconv.ParseInt(f[11], 10, 64)
	st.stime, _ = strconv.ParseInt(f[12], 10, 64)
	st.cutime, _ = strconv.ParseInt(f[13], 10, 64)
	st.cstime, _ = strconv.ParseInt(f[14], 10, 64)
	return st, true
}
