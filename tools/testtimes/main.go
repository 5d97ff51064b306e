// Command testtimes shows where the time of a test run goes: a table of
// packages and one of tests, slowest first, read from `go test -json`
// output (make test-times, docs/testing.md).
//
//	testtimes [-tests N] [FILE...]       read go test -json output (stdin if none), print the tables
//	testtimes exec BINARY [ARG...]       run a test binary (go test -exec), then print its CPU time
//	testtimes step NAME CMD [ARG...]     run a command, then print its wall and CPU time under NAME
//
// Run as go test's -exec program, it prints the test binary's CPU time
// (user and system, its own and that of the children it waited for) as a
// line of the package's output, which the tables then show beside the
// wall time: on a shared machine CPU-seconds say more than seconds.
// Lines that are not JSON (make's, a step's) are ignored, except the
// lines this command prints.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// marker starts the lines that exec and step print.
const marker = "testtimes:"

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "exec":
			return runTimed(args[1:], "cpu", stdout, stderr)
		case "step":
			if len(args) < 3 {
				fmt.Fprintln(stderr, "usage: testtimes step NAME CMD [ARG...]")
				return 2
			}
			return runTimed(args[2:], "step "+args[1], stdout, stderr)
		}
	}
	fs := flag.NewFlagSet("testtimes", flag.ContinueOnError)
	fs.SetOutput(stderr)
	top := fs.Int("tests", 40, "how many of the slowest tests to list (0: all)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var runLog Log
	if fs.NArg() == 0 {
		if err := runLog.Read(stdin); err != nil {
			fmt.Fprintf(stderr, "testtimes: %v\n", err)
			return 1
		}
	}
	for _, name := range fs.Args() {
		f, err := os.Open(name)
		if err != nil {
			fmt.Fprintf(stderr, "testtimes: %v\n", err)
			return 1
		}
		err = runLog.Read(f)
		f.Close()
		if err != nil {
			fmt.Fprintf(stderr, "testtimes: %s: %v\n", name, err)
			return 1
		}
	}
	runLog.Print(stdout, *top)
	return 0
}

// runTimed runs argv with this process's stdio, then prints one marker
// line: label, wall seconds, user and system CPU-seconds. It exits as
// the command did.
func runTimed(argv []string, label string, stdout, stderr io.Writer) int {
	if len(argv) == 0 {
		fmt.Fprintln(stderr, "testtimes: no command")
		return 2
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	// go test stops a test binary that outlives -timeout with SIGQUIT
	// (for its goroutine dump) and then kills it: pass signals on.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "testtimes: %v\n", err)
		return 2
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sigs:
				_ = cmd.Process.Signal(s)
			case <-done:
				return
			}
		}
	}()
	err := cmd.Wait()
	close(done)
	wall := time.Since(start)
	code := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
		if code < 0 {
			code = 1 // killed by a signal
		}
	case err != nil:
		fmt.Fprintf(stderr, "testtimes: %v\n", err)
		code = 2
	}
	ps := cmd.ProcessState
	fmt.Fprintf(stdout, "%s %s wall=%.2f user=%.2f sys=%.2f\n", marker, label,
		wall.Seconds(), ps.UserTime().Seconds(), ps.SystemTime().Seconds())
	return code
}

// event is the part of a go test -json event that the tables need.
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// Package is one test binary's run.
type Package struct {
	Name    string
	Result  string  // pass, fail, skip; "" if the log ends before it
	Elapsed float64 // wall seconds, as go test reports it
	CPU     float64 // user+system seconds; 0 when not run under exec
	Tests   int     // top-level tests that ended
}

// Test is one test's (or subtest's) run.
type Test struct {
	Package, Name string
	Result        string
	Elapsed       float64
}

// Step is a command timed by step.
type Step struct {
	Name            string
	Wall, User, Sys float64
}

// Log is what one or more go test -json streams said.
type Log struct {
	Packages []*Package
	Tests    []Test
	Steps    []Step
	pkgs     map[string]*Package
}

func (l *Log) pkg(name string) *Package {
	if l.pkgs == nil {
		l.pkgs = map[string]*Package{}
	}
	p := l.pkgs[name]
	if p == nil {
		p = &Package{Name: name}
		l.pkgs[name] = p
		l.Packages = append(l.Packages, p)
	}
	return p
}

// Read adds the events of r. A package run twice (two invocations in one
// log) adds up.
func (l *Log) Read(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		if line[0] != '{' {
			if s, ok := parseStep(string(line)); ok {
				l.Steps = append(l.Steps, s)
			}
			continue
		}
		var e event
		if json.Unmarshal(line, &e) != nil || e.Package == "" {
			continue
		}
		switch {
		case e.Action == "output" && e.Test == "":
			if cpu, ok := parseCPU(e.Output); ok {
				l.pkg(e.Package).CPU += cpu
			}
		case e.Action == "pass" || e.Action == "fail" || e.Action == "skip":
			if e.Test == "" {
				p := l.pkg(e.Package)
				p.Elapsed += e.Elapsed
				if p.Result != "fail" {
					p.Result = e.Action
				}
				continue
			}
			l.Tests = append(l.Tests, Test{Package: e.Package, Name: e.Test, Result: e.Action, Elapsed: e.Elapsed})
			if !strings.Contains(e.Test, "/") {
				l.pkg(e.Package).Tests++
			}
		}
	}
	return sc.Err()
}

// parseCPU reads the line exec prints: user+system seconds.
func parseCPU(line string) (float64, bool) {
	f, ok := markerFields(line, "cpu")
	if !ok {
		return 0, false
	}
	return f["user"] + f["sys"], true
}

// parseStep reads the line step prints.
func parseStep(line string) (Step, bool) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(line), marker+" step ")
	if !ok {
		return Step{}, false
	}
	name, _, _ := strings.Cut(rest, " ")
	f, ok := markerFields(line, "step "+name)
	if !ok {
		return Step{}, false
	}
	return Step{Name: name, Wall: f["wall"], User: f["user"], Sys: f["sys"]}, true
}

// markerFields parses "testtimes: LABEL k=v k=v".
func markerFields(line, label string) (map[string]float64, bool) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(line), marker+" "+label+" ")
	if !ok {
		return nil, false
	}
	f := map[string]float64{}
	for _, kv := range strings.Fields(rest) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, false
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, false
		}
		f[k] = x
	}
	return f, len(f) > 0
}

// Print writes the steps, the packages and the top slowest tests (all
// when top is 0), slowest first.
func (l *Log) Print(w io.Writer, top int) {
	if len(l.Steps) > 0 {
		var wall, cpu float64
		fmt.Fprintf(w, "%8s %8s  %s\n", "wall s", "CPU s", "step")
		for _, s := range l.Steps {
			fmt.Fprintf(w, "%8.1f %8.1f  %s\n", s.Wall, s.User+s.Sys, s.Name)
			wall += s.Wall
			cpu += s.User + s.Sys
		}
		fmt.Fprintf(w, "%8.1f %8.1f  %s\n\n", wall, cpu, "total")
	}
	pkgs := append([]*Package(nil), l.Packages...)
	sort.SliceStable(pkgs, func(i, j int) bool { return pkgs[i].Elapsed > pkgs[j].Elapsed })
	var wall, cpu float64
	fmt.Fprintf(w, "%8s %8s %6s  %-6s %s\n", "wall s", "CPU s", "tests", "result", "package")
	for _, p := range pkgs {
		if p.Tests == 0 && p.Elapsed == 0 {
			continue // no test files
		}
		fmt.Fprintf(w, "%8.1f %8s %6d  %-6s %s\n", p.Elapsed, cpuCell(p.CPU), p.Tests, orNone(p.Result), shortPkg(p.Name))
		wall += p.Elapsed
		cpu += p.CPU
	}
	fmt.Fprintf(w, "%8.1f %8s %6s  %-6s %s\n\n", wall, cpuCell(cpu), "", "", "sum (packages run side by side overlap)")
	tests := append([]Test(nil), l.Tests...)
	sort.SliceStable(tests, func(i, j int) bool { return tests[i].Elapsed > tests[j].Elapsed })
	if top > 0 && len(tests) > top {
		tests = tests[:top]
	}
	fmt.Fprintf(w, "%8s  %-6s %s\n", "wall s", "result", "test")
	for _, t := range tests {
		fmt.Fprintf(w, "%8.1f  %-6s %s %s\n", t.Elapsed, t.Result, shortPkg(t.Package), t.Name)
	}
	var failed []string
	for _, t := range l.Tests {
		if t.Result == "fail" {
			failed = append(failed, shortPkg(t.Package)+" "+t.Name)
		}
	}
	if len(failed) > 0 {
		fmt.Fprintf(w, "\nfailed: %s\n", strings.Join(failed, ", "))
	}
}

func cpuCell(s float64) string {
	if s == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", s)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// shortPkg drops the module path's common prefix.
func shortPkg(p string) string {
	if s, ok := strings.CutPrefix(p, "github.com/idemgate/idemgate/"); ok {
		return s
	}
	return p
}
