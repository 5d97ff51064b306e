package testenv

import (
	"fmt"
	"testing"
)

// ExampleDatabase gives a runnable Example a fresh database on the test
// binary's server, as PostgresDSN gives a test one (Examples have no
// testing.TB), and a function that drops it. A failure panics, which fails
// the Example.
func ExampleDatabase() (url string, drop func()) {
	tb := &exampleTB{}
	url = PostgresDSN(tb)
	return url, func() {
		for i := len(tb.cleanups) - 1; i >= 0; i-- {
			tb.cleanups[i]()
		}
	}
}

// exampleTB is the part of testing.TB that this package uses.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func (*exampleTB) Helper()                   {}
func (tb *exampleTB) Cleanup(f func())       { tb.cleanups = append(tb.cleanups, f) }
func (*exampleTB) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (*exampleTB) Errorf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (*exampleTB) Skipf(f string, a ...any)  { panic(fmt.Sprintf(f, a...)) }
