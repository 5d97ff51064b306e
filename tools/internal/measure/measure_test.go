package measure_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/idemgate/idemgate/tools/internal/measure"
)

func ms(v ...int) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	thousand := make([]int, 1000)
	for i := range thousand {
		thousand[i] = i + 1
	}
	tests := []struct {
		name  string
		given []time.Duration
		p     float64
		want  time.Duration
	}{
		{name: "empty", given: nil, p: 0.5, want: 0},
		{name: "one", given: ms(7), p: 0.99, want: 7 * time.Millisecond},
		{name: "median of five", given: ms(1, 2, 3, 4, 5), p: 0.5, want: 3 * time.Millisecond},
		{name: "p99 of five", given: ms(1, 2, 3, 4, 5), p: 0.99, want: 5 * time.Millisecond},
		{name: "p50 of 1000", given: ms(thousand...), p: 0.5, want: 500 * time.Millisecond},
		{name: "p99 of 1000", given: ms(thousand...), p: 0.99, want: 990 * time.Millisecond},
		{name: "p99.9 of 1000", given: ms(thousand...), p: 0.999, want: 999 * time.Millisecond},
		{name: "max", given: ms(thousand...), p: 1, want: 1000 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := measure.Percentile(tt.given, tt.p); got != tt.want {
				t.Errorf("Percentile(p=%v) = %v, want %v", tt.p, got, tt.want)
			}
		})
	}
}

func TestStartCPUProfile(t *testing.T) {
	stop, err := measure.StartCPUProfile("")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	path := filepath.Join(t.TempDir(), "cpu.prof")
	if stop, err = measure.StartCPUProfile(path); err != nil {
		t.Fatal(err)
	}
	stop()
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("profile not written: %v", err)
	}
	if _, err := measure.StartCPUProfile(filepath.Join(t.TempDir(), "no", "such", "dir")); err == nil {
		t.Fatal("a profile in a missing directory must fail")
	}
}

func ExamplePercentile() {
	lat := ms(12, 3, 7, 40, 5)
	slices.Sort(lat)
	fmt.Println(measure.Percentile(lat, 0.5), measure.Percentile(lat, 0.99))
	// Output: 7ms 40ms
}
