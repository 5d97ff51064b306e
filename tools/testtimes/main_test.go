package main

import (
	"bytes"
	"strings"
	"testing"
)

// sampleLog is a make test-times log in small: make's lines, a step's marker,
// two packages (one run twice, as unit runs middleware with and without
// -race), their exec markers, a failing subtest.
const sampleLog = `go vet ./...
testtimes: step vet wall=12.50 user=20.00 sys=3.00
{"Action":"run","Package":"example.com/m/a","Test":"TestSlow"}
{"Action":"pass","Package":"example.com/m/a","Test":"TestSlow","Elapsed":9.5}
{"Action":"pass","Package":"example.com/m/a","Test":"TestFast","Elapsed":0.1}
{"Action":"output","Package":"example.com/m/a","Output":"testtimes: cpu wall=10.10 user=7.00 sys=1.00\n"}
{"Action":"pass","Package":"example.com/m/a","Elapsed":10.2}
{"Action":"fail","Package":"example.com/m/b","Test":"TestX/case","Elapsed":2}
{"Action":"fail","Package":"example.com/m/b","Test":"TestX","Elapsed":2.5}
{"Action":"output","Package":"example.com/m/b","Output":"testtimes: cpu wall=3.00 user=2.00 sys=0.50\n"}
{"Action":"fail","Package":"example.com/m/b","Elapsed":3}
{"Action":"pass","Package":"example.com/m/a","Test":"TestAllocs","Elapsed":1}
{"Action":"output","Package":"example.com/m/a","Output":"testtimes: cpu wall=1.50 user=1.00 sys=0.20\n"}
{"Action":"pass","Package":"example.com/m/a","Elapsed":1.5}
not json {
`

func TestReadAddsUpPackagesAndKeepsEveryTest(t *testing.T) {
	var l Log
	if err := l.Read(strings.NewReader(sampleLog)); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		pkg         string
		wantElapsed float64
		wantCPU     float64
		wantTests   int
		wantResult  string
	}{
		{name: "a package run twice adds up", pkg: "example.com/m/a", wantElapsed: 11.7, wantCPU: 9.2, wantTests: 3, wantResult: "pass"},
		{name: "a failed package stays failed", pkg: "example.com/m/b", wantElapsed: 3, wantCPU: 2.5, wantTests: 1, wantResult: "fail"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := l.pkgs[tc.pkg]
			if p == nil {
				t.Fatalf("no package %s", tc.pkg)
			}
			if !near(p.Elapsed, tc.wantElapsed) || !near(p.CPU, tc.wantCPU) || p.Tests != tc.wantTests || p.Result != tc.wantResult {
				t.Errorf("got %+v; want elapsed %v, CPU %v, %d tests, %s", *p, tc.wantElapsed, tc.wantCPU, tc.wantTests, tc.wantResult)
			}
		})
	}
	if len(l.Tests) != 5 {
		t.Errorf("%d tests, want 5 (subtests too): %+v", len(l.Tests), l.Tests)
	}
	if len(l.Steps) != 1 || l.Steps[0] != (Step{Name: "vet", Wall: 12.5, User: 20, Sys: 3}) {
		t.Errorf("steps %+v, want vet 12.5 s, 23 CPU-s", l.Steps)
	}
}

func TestPrintListsSlowestFirstAndNamesFailures(t *testing.T) {
	var l Log
	if err := l.Read(strings.NewReader(sampleLog)); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	l.Print(&out, 2)
	s := out.String()
	for _, want := range []string{"vet", "    11.7      9.2      3  pass   example.com/m/a", "failed: example.com/m/b TestX/case, example.com/m/b TestX"} {
		if !strings.Contains(s, want) {
			t.Errorf("no %q in\n%s", want, s)
		}
	}
	if a, b := strings.Index(s, "TestSlow"), strings.Index(s, "TestX"); a < 0 || b < 0 || a > b {
		t.Errorf("TestSlow (9.5 s) not listed before TestX (2.5 s):\n%s", s)
	}
	if strings.Contains(s, "TestFast") {
		t.Errorf("-tests 2 listed a third test:\n%s", s)
	}
}

func TestExecPassesTheExitCodeAndPrintsCPU(t *testing.T) {
	for _, tc := range []struct {
		name string
		argv []string
		want int
	}{
		{name: "success", argv: []string{"sh", "-c", "exit 0"}, want: 0},
		{name: "failure", argv: []string{"sh", "-c", "exit 3"}, want: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if code := run(append([]string{"exec"}, tc.argv...), nil, &out, &errOut); code != tc.want {
				t.Fatalf("exit %d, want %d (%s)", code, tc.want, errOut.String())
			}
			if _, ok := parseCPU(strings.TrimSpace(out.String())); !ok {
				t.Errorf("no CPU line: %q", out.String())
			}
		})
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
