package cli

import (
	"io"
	"os"
	"strings"
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

// Flags may come before the verb; one that takes no value must not take
// the verb for its value.
func TestVerbAfterFlags(t *testing.T) {
	t.Parallel()
	env := Env{Stdout: io.Discard, Stderr: io.Discard}
	tests := []struct {
		name    string
		given   []string
		want    string
		wantPre []string
	}{
		{"bool", []string{"-json", "list"}, "list", []string{"-json"}},
		{"bool, another", []string{"-new-kind", "pause", "video"}, "pause", []string{"-new-kind"}},
		{"valued", []string{"-schema", "billing", "list"}, "list", []string{"-schema", "billing"}},
		{"valued with =", []string{"-schema=billing", "-check", "status"}, "status", []string{"-schema=billing", "-check"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, pre, _, err := verb(tt.given, "usage", env)
			if err != nil || got != tt.want || strings.Join(pre, " ") != strings.Join(tt.wantPre, " ") {
				t.Fatalf("verb(%q) = %q, %q, %v; want %q, %q", tt.given, got, pre, err, tt.want, tt.wantPre)
			}
		})
	}
}
