package proctest

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// build is one package's executable.
type build struct {
	once sync.Once
	path string
	err  error
}

// buildSet is the executables of one test binary, in one directory.
type buildSet struct {
	mu    sync.Mutex
	dir   string
	byPkg map[string]*build
}

// builds holds what Build made. A package-level value, as testenv's
// servers are: a test binary has one set of builds, removed by Cleanup.
var builds buildSet

// Build compiles the main package pkg once per test binary and returns the
// executable's path. pkg is what go build takes: an import path, such as
// "github.com/idemgate/idemgate/example", builds from any module of the
// workspace. The executable has the race detector when the tests run with
// it, so a race in a child makes it exit with status 66. Build fails the
// test if the package does not build; call it from the test's goroutine.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	b := builds.get(pkg)
	b.once.Do(func() { b.path, b.err = builds.compile(pkg) })
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// Cleanup removes what Build made. A package that builds calls it after
// its tests ran:
//
//	func TestMain(m *testing.M) {
//		code := testenv.Main(m)
//		proctest.Cleanup()
//		os.Exit(code)
//	}
func Cleanup() {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.dir != "" {
		os.RemoveAll(builds.dir)
	}
	builds.dir, builds.byPkg = "", nil
}

func (s *buildSet) get(pkg string) *build {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byPkg == nil {
		s.byPkg = map[string]*build{}
	}
	b := s.byPkg[pkg]
	if b == nil {
		b = &build{}
		s.byPkg[pkg] = b
	}
	return b
}

// outDir returns a fresh directory for one executable.
func (s *buildSet) outDir(name string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dir == "" {
		dir, err := os.MkdirTemp("", "idemgate-proctest-")
		if err != nil {
			return "", fmt.Errorf("proctest: build dir: %w", err)
		}
		s.dir = dir
	}
	dir, err := os.MkdirTemp(s.dir, name+"-")
	if err != nil {
		return "", fmt.Errorf("proctest: build dir: %w", err)
	}
	return dir, nil
}

func (s *buildSet) compile(pkg string) (string, error) {
	name := path.Base(filepath.ToSlash(pkg))
	dir, err := s.outDir(name)
	if err != nil {
		return "", err
	}
	exe := filepath.Join(dir, name)
	args := []string{"build", "-o", exe}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, pkg)
	// go test puts its own go first on PATH.
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("proctest: go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return exe, nil
}
