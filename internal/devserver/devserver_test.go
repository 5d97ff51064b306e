package devserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestServersDieWithTheirParent starts redis-server from a child process that
// then crashes, and checks that the server is gone and that the next start
// removes the crashed run's directory.
func TestServersDieWithTheirParent(t *testing.T) {
	if os.Getenv("DEVSERVER_CRASH_CHILD") == "1" {
		r, err := StartRedis(context.Background(), 0)
		if err != nil {
			fmt.Println("error", err)
			os.Exit(3)
		}
		fmt.Println(r.cmd.Process.Pid, r.Dir)
		os.Exit(2) // a crash: no Stop, no cleanup
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		if testing.Short() {
			t.Skip("redis-server not installed")
		}
		t.Fatal("redis-server not installed (apt-get install redis-server)")
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestServersDieWithTheirParent$")
	cmd.Env = append(os.Environ(), "DEVSERVER_CRASH_CHILD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	_ = cmd.Wait()
	pidText, dir, ok := strings.Cut(strings.TrimSpace(line), " ")
	pid, err := strconv.Atoi(pidText)
	if !ok || err != nil {
		t.Fatalf("child printed %q", line)
	}

	deadline := time.Now().Add(10 * time.Second)
	for !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("redis-server %d outlived its crashed parent", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Test binaries of other packages may run in parallel and sweep the
	// dir first; either way, no start may leave it behind.
	r, err := StartRedis(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("next start left the crashed run's dir %s: %v", dir, err)
	}
}

// TestStartChildDiesWithItsParent starts a child from a process that then
// exits without waiting for it, and checks that the child is gone.
func TestStartChildDiesWithItsParent(t *testing.T) {
	if os.Getenv("DEVSERVER_ORPHAN_PARENT") == "1" {
		cmd := exec.Command("sleep", "600")
		if err := StartChild(cmd); err != nil {
			fmt.Println("error", err)
			os.Exit(3)
		}
		fmt.Println(cmd.Process.Pid)
		os.Exit(0) // without Wait: the child would be orphaned
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestStartChildDiesWithItsParent$")
	cmd.Env = append(os.Environ(), "DEVSERVER_ORPHAN_PARENT=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("parent: %v\n%s", err, out)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("parent printed %q", out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("child %d outlived its parent", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestStopRemovesFiles(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed")
	}
	r, err := StartRedis(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(r.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Stop left %s", r.Dir)
	}
	select {
	case <-r.Exited():
	default:
		t.Fatal("Stop returned before the server exited")
	}
}

func TestContainsReady(t *testing.T) {
	tests := []struct {
		name  string
		given string
		want  bool
	}{
		{"ready", "1\n/d\n1\n5432\n/s\n127.0.0.1\n  1  2\nready   \n", true},
		{"starting", "1\n/d\n1\n5432\n/s\n127.0.0.1\n  1  2\nstarting\n", false},
		{"short", "1\n/d\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := containsReady([]byte(tt.given)); got != tt.want {
				t.Fatalf("containsReady = %v, want %v", got, tt.want)
			}
		})
	}
}
