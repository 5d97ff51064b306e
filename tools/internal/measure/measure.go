// Package measure holds what the load tools and benchmarks share: percentiles
// of latency samples and a CPU profile flag.
package measure

import (
	"fmt"
	"os"
	"runtime/pprof"
	"time"
)

// Percentile returns the nearest-rank p-quantile (0 < p ≤ 1) of sorted
// samples, ascending; 0 for none.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// StartCPUProfile writes a CPU profile of this process to path until the
// returned stop is called. An empty path profiles nothing; stop is then a
// no-op.
func StartCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
