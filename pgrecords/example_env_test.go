package pgrecords_test

import (
	"fmt"
	"testing"

	"github.com/idemgate/idemgate/internal/testenv"
)

// exampleDatabase gives an Example a fresh database on the test binary's
// throwaway server (testenv wants a testing.TB, which Examples lack) and
// a function that drops it.
func exampleDatabase() (url string, drop func()) {
	tb := &exampleTB{}
	url = testenv.PostgresDSN(tb)
	return url, func() {
		for i := len(tb.cleanups) - 1; i >= 0; i-- {
			tb.cleanups[i]()
		}
	}
}

// exampleTB is the part of testing.TB that testenv uses; failures panic,
// which fails the Example.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func (*exampleTB) Helper()                   {}
func (tb *exampleTB) Cleanup(f func())       { tb.cleanups = append(tb.cleanups, f) }
func (*exampleTB) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (*exampleTB) Errorf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (*exampleTB) Skipf(f string, a ...any)  { panic(fmt.Sprintf(f, a...)) }
