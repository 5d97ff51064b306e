package cli

import (
	"os"
	"testing"
)

// A cron job's or a CI step's stdin is the null device, a character
// device like a terminal; a confirmation must not be asked of it (it
// reads nothing), and "-yes" is then the way to confirm.
func TestStdinIsTerminalNotTheNullDevice(t *testing.T) {
	t.Parallel()
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	for name, f := range map[string]*os.File{"null device": null, "pipe": r} {
		if StdinIsTerminal(f) {
			t.Errorf("%s: a terminal", name)
		}
	}
}
