package main

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestMakePlan(t *testing.T) {
	t.Parallel()
	tests := []struct {
		modes   string
		want    []string // nil: dealt by the seed
		wantErr bool
	}{
		{modes: "none", want: []string{}},
		{modes: "all", want: modeNames},
		{modes: "short-lease", want: []string{"short-lease"}},
		{modes: "flood, limits,flood", want: []string{"flood", "limits"}},
		{modes: "random"},
		{modes: "", want: nil},
		{modes: "slow", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.modes, func(t *testing.T) {
			t.Parallel()
			p, err := makePlan(tc.modes, 7, time.Second)
			if (err != nil) != tc.wantErr {
				t.Fatalf("makePlan(%q) error %v, want error %v", tc.modes, err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if tc.want != nil && !slices.Equal(append([]string{}, p.modes...), tc.want) {
				t.Errorf("modes %v, want %v", p.modes, tc.want)
			}
			again, _ := makePlan(tc.modes, 7, time.Second)
			if !slices.Equal(p.modes, again.modes) || p.lease != again.lease || p.genTime != again.genTime {
				t.Errorf("the same seed dealt %v then %v", p, again)
			}
			if p.has("short-lease") {
				if p.lease < time.Second || p.lease >= 2*time.Second {
					t.Errorf("lease %v outside [1s, 2s)", p.lease)
				}
				if p.genTime <= p.lease || p.exportTime <= p.lease {
					t.Errorf("generation %v and export %v must outlast the lease %v", p.genTime, p.exportTime, p.lease)
				}
				if p.longest() <= p.lease {
					t.Errorf("the longest fault %v does not outlast the lease %v", p.longest(), p.lease)
				}
			} else if p.lease != 0 || p.genTime != time.Second {
				t.Errorf("without short-lease: lease %v, generation %v; want the defaults", p.lease, p.genTime)
			}
		})
	}
	// Random modes differ across seeds: over 16 seeds every mode is drawn
	// at least once and left out at least once.
	drawn := map[string]int{}
	for seed := range int64(16) {
		p, _ := makePlan("random", seed, time.Second)
		for _, m := range p.modes {
			drawn[m]++
		}
	}
	for _, m := range modeNames {
		if drawn[m] == 0 || drawn[m] == 16 {
			t.Errorf("mode %s drawn at %d of 16 seeds", m, drawn[m])
		}
	}
}

// TestAcksConcurrent: 2xx answers reported from many clients reach the
// one waiter of their node, once, and nobody blocks.
func TestAcksConcurrent(t *testing.T) {
	t.Parallel()
	var a acks
	ctx := context.Background()
	got := make(chan string, 1)
	go func() { got <- a.next(ctx, "n1", time.Now().Add(time.Minute)) }()
	// The reporters go on until the waiter has its answer, whenever it
	// began to wait.
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
					a.got([]string{"n1", "n2"}[i%2], "POST /v1/images 202")
				}
			}
		}()
	}
	what := <-got
	close(done)
	wg.Wait()
	if what != "POST /v1/images 202" {
		t.Errorf("the waiter got %q", what)
	}
	if what := a.next(ctx, "n2", time.Now().Add(10*time.Millisecond)); what != "" {
		t.Errorf("with no 2xx after it began waiting, next returned %q", what)
	}
	var none *acks
	none.got("n1", "x") // a workload without a nemesis has no acks
}
