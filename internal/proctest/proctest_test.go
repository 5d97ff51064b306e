package proctest_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/proctest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	proctest.Cleanup()
	os.Exit(code)
}

// TestHelperProcess is the child of the other tests: they run this test
// binary again with PROCTEST_HELPER naming what the child does.
func TestHelperProcess(t *testing.T) {
	switch os.Getenv("PROCTEST_HELPER") {
	case "":
		t.Skip("the child of the other tests")
	case "serve":
		// Up in two writes, the first one mid-line; down on SIGTERM.
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		fmt.Println("starting")
		fmt.Print("listening on http://127.0.0.1:8")
		time.Sleep(100 * time.Millisecond)
		fmt.Println("0")
		<-term
		fmt.Println("terminated")
		os.Exit(0)
	case "exit":
		fmt.Fprint(os.Stderr, "bye")
		os.Exit(3)
	}
}

func helper(mode string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run", "^TestHelperProcess$")
	cmd.Env = append(os.Environ(), "PROCTEST_HELPER="+mode)
	return cmd
}

func start(t *testing.T, mode string) *proctest.Process {
	t.Helper()
	p, err := proctest.Start(t, helper(mode))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var listening = regexp.MustCompile(`listening on (http://\S+)`)

func TestWaitOutputMatchesWholeLines(t *testing.T) {
	t.Parallel()
	p := start(t, "serve")
	m, err := p.WaitOutput(listening, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if m[1] != "http://127.0.0.1:80" {
		t.Fatalf("WaitOutput = %q, want the whole line's URL http://127.0.0.1:80", m)
	}
	if _, err := p.WaitOutput(regexp.MustCompile(`never written`), 50*time.Millisecond); err == nil ||
		!strings.Contains(err.Error(), "within 50ms") || !strings.Contains(err.Error(), "starting") {
		t.Fatalf("WaitOutput of a line never written: %v, want a timeout with the output", err)
	}
}

func TestWaitOutputAfterExit(t *testing.T) {
	t.Parallel()
	p := start(t, "exit")
	if _, err := p.WaitOutput(listening, time.Minute); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("WaitOutput of a line the child never wrote: %v, want an error saying it exited", err)
	}
	// Once the child has exited, its unterminated last line counts.
	if _, err := p.WaitOutput(regexp.MustCompile(`^bye$`), time.Minute); err != nil {
		t.Fatal(err)
	}
	var exit *exec.ExitError
	if err := p.Wait(time.Minute); !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("Wait = %v, want exit status 3", err)
	}
}

func TestKill(t *testing.T) {
	t.Parallel()
	p := start(t, "serve")
	if _, err := p.WaitOutput(listening, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
	default:
		t.Fatal("Kill returned before the child exited")
	}
	if strings.Contains(p.Output(), "terminated") {
		t.Fatal("the child saw SIGTERM; Kill sends SIGKILL")
	}
	if err := p.Signal(syscall.SIGTERM); !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("Signal after exit = %v, want os.ErrProcessDone", err)
	}
}

// recorder is a test that records its cleanups and logs.
type recorder struct {
	testing.TB
	failed   bool
	cleanups []func()
	logs     []string
}

func (r *recorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *recorder) Failed() bool     { return r.failed }
func (r *recorder) Logf(format string, args ...any) {
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

func (r *recorder) end() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

// TestEndOfTestStopsTheChild: a stopped child is continued and terminated
// (not killed) when its test ends, and its output is logged if the test
// failed.
func TestEndOfTestStopsTheChild(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		failed  bool
		wantLog bool
	}{
		{name: "passed", failed: false, wantLog: false},
		{name: "failed", failed: true, wantLog: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := &recorder{TB: t, failed: tt.failed}
			p, err := proctest.Start(r, helper("serve"))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.WaitOutput(listening, time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := p.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			r.end()
			select {
			case <-p.Exited():
			default:
				t.Fatal("the child runs after its test ended")
			}
			if !strings.HasSuffix(p.Output(), "terminated\n") {
				t.Fatalf("the child did not exit on SIGTERM; output:\n%s", p.Output())
			}
			logged := len(r.logs) == 1 && strings.Contains(r.logs[0], "terminated")
			if logged != tt.wantLog {
				t.Fatalf("logs %q; want the output logged: %v", r.logs, tt.wantLog)
			}
		})
	}
}

func TestStartError(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("/nonexistent/proctest-child")
	if _, err := proctest.Start(t, cmd); err == nil || !strings.Contains(err.Error(), "proctest-child") {
		t.Fatalf("Start of a missing program: %v, want an error naming it", err)
	}
}

func TestBuild(t *testing.T) {
	t.Parallel()
	bin := proctest.Build(t, "./testdata/hello")
	if again := proctest.Build(t, "./testdata/hello"); again != bin {
		t.Fatalf("second Build = %s, want the first one's %s", again, bin)
	}
	out, err := exec.Command(bin, "world").Output()
	if err != nil || string(out) != "hello world\n" {
		t.Fatalf("hello world: %q %v", out, err)
	}
	info, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	if race := strings.Contains(string(info), "-race=true"); race != proctest.RaceEnabled {
		t.Fatalf("built with -race: %v, want %v (as the tests run)\n%s", race, proctest.RaceEnabled, info)
	}
}
