// Package proctest runs programs as child processes in tests: it builds a
// main package once per test binary, starts it, waits for a line of its
// output, signals or kills it, and stops it when the test ends.
//
// Children start through devserver.StartChild, so the kernel kills them if
// the test binary dies first. At the end of the test that started it, a
// child still running gets SIGCONT (in case a test stopped it) and
// SIGTERM, and SIGKILL if it is still there 15 seconds later; if the test
// failed, its output is logged.
//
// Start and the methods of Process report failures as errors and never
// fail the test themselves, so goroutines other than the test's may start
// and wait for processes:
//
//	bin := proctest.Build(t, "github.com/idemgate/idemgate/example")
//	p, err := proctest.Start(t, exec.Command(bin, "serve", "-addr", "127.0.0.1:0"))
//	if err != nil {
//		t.Fatal(err)
//	}
//	m, err := p.WaitOutput(regexp.MustCompile(`listening on (http://\S+)`), time.Minute)
//	if err != nil {
//		t.Fatal(err)
//	}
//	url := m[1]
//
// A package that calls Build removes the executables in its TestMain (see
// Cleanup).
package proctest
