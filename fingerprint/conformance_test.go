package fingerprint

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestConformance checks every RFC 8785 test vector byte for byte.
func TestConformance(t *testing.T) {
	t.Parallel()
	inputs, err := filepath.Glob(filepath.Join("testdata", "jcs", "input", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(inputs) == 0 {
		t.Fatal("no vectors in testdata/jcs/input")
	}
	for _, in := range inputs {
		name := filepath.Base(in)
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			given, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile(filepath.Join("testdata", "jcs", "output", name))
			if err != nil {
				t.Fatal(err)
			}
			got, err := Canonicalize(given)
			if err != nil {
				t.Fatalf("Canonicalize: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("Canonicalize(%s)\n got: %s\nwant: %s", name, got, want)
			}
			again, err := Canonicalize(got)
			if err != nil || !bytes.Equal(again, got) {
				t.Errorf("canonical form is not a fixed point: %s, %v", again, err)
			}
		})
	}
}
