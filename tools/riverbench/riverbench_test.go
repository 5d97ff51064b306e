package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/pgstore"
)

// TestMain lets the test binary be its own worker process, as the
// command is.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		if err := workerMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "riverbench worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(testenv.Main(m))
}

// tinySizes run every row in seconds.
func tinySizes() sizes {
	return sizes{Rounds: 1, Inserts: 40, Clients: 4, BatchSize: 10, Batches: 3, BatchClients: 2,
		WorkRounds: 1, WorkTasks: 60, WorkTasksSlow: 30, Slots: 4,
		LatencyRounds: 1, LatencySamples: 3, LatencySlot: 20 * time.Millisecond, Settle: 100 * time.Millisecond}
}

// TestRowsComplete runs a tiny round of every row on every system. The rows
// check as they go that a new key creates a task and a repeated one finds
// it, that every batch stores all its tasks, that every task completes
// exactly once with one attempt, and that each latency task starts once.
func TestRowsComplete(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and worker processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dsns := map[string]string{}
	for _, sys := range systems() {
		dsns[sys] = testenv.PostgresDSN(t)
	}
	size := tinySizes()
	b, err := newBench(ctx, exe, dsns, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.close)
	b.log = io.Discard
	if testing.Verbose() {
		b.log = os.Stderr
	}
	if err := b.run(ctx, []string{rowInsert, rowDup, rowBatch, rowWork, rowDrain, rowLatency}); err != nil {
		t.Fatal(err)
	}
	wantTasks := map[string]map[string]int{
		rowInsert:   {sysPgstore: size.Inserts, sysRiverTuned: size.Inserts, sysRiverDefault: size.Inserts},
		rowDup:      {sysPgstore: size.Inserts, sysRiverTuned: size.Inserts, sysRiverDefault: size.Inserts},
		rowBatch:    {sysPgstore: size.Batches * size.BatchSize, sysRiverTuned: size.Batches * size.BatchSize, sysRiverDefault: size.Batches * size.BatchSize},
		workRow(1):  {sysPgstore: size.WorkTasks, sysRiverTuned: size.WorkTasks, sysRiverDefault: size.WorkTasksSlow},
		workRow(2):  {sysPgstore: size.WorkTasks, sysRiverTuned: size.WorkTasks, sysRiverDefault: size.WorkTasksSlow},
		drainRow(1): {sysPgstore: size.WorkTasks, sysRiverTuned: size.WorkTasks, sysRiverDefault: size.WorkTasksSlow},
		drainRow(2): {sysPgstore: size.WorkTasks, sysRiverTuned: size.WorkTasks, sysRiverDefault: size.WorkTasksSlow},
	}
	for row, bySys := range wantTasks {
		for sys, want := range bySys {
			got := b.res.rates[row][sys]
			if got.tasks != want || got.elapsed <= 0 {
				t.Errorf("%s %s: %d tasks in %v, want %d tasks in a positive time", row, sys, got.tasks, got.elapsed, want)
			}
		}
	}
	for _, sys := range systems() {
		lat := b.res.latency[sys]
		if len(lat) != size.LatencySamples {
			t.Errorf("latency %s: %d samples, want %d", sys, len(lat), size.LatencySamples)
		}
		for _, d := range lat {
			if d <= 0 {
				t.Errorf("latency %s: sample %v, want > 0", sys, d)
			}
		}
	}
}

// The shapes SubmitMany may have, for TestSubmitManyOf.
type (
	fakeResult struct {
		Task pgstore.Task
		Err  error
	}
	manyOK      struct{ results []fakeResult }
	manyErr     struct{}
	manyWrongIn struct{}
	manyNoErr   struct{}
	manyNone    struct{}
)

func (f manyOK) SubmitMany(_ context.Context, ts []pgstore.NewTask) ([]fakeResult, error) {
	return f.results, nil
}

func (manyErr) SubmitMany(context.Context, []pgstore.NewTask) ([]fakeResult, error) {
	return nil, errors.New("database down")
}

func (manyWrongIn) SubmitMany(context.Context, []string) ([]fakeResult, error) { return nil, nil }

func (manyNoErr) SubmitMany(context.Context, []pgstore.NewTask) ([]pgstore.Task, error) {
	return nil, nil
}

// TestSubmitManyOf checks the reflective call that the batch row makes once
// pgstore has SubmitMany: the shape check, and that a short result list, a
// call error and an item's error all fail the batch.
func TestSubmitManyOf(t *testing.T) {
	tasks := []pgstore.NewTask{newTask("a"), newTask("b")}
	tests := []struct {
		name      string
		given     any
		wantFound bool
		wantErr   string // "" for none
	}{
		{name: "all stored", given: manyOK{results: []fakeResult{{}, {}}}, wantFound: true},
		{name: "item conflict", given: manyOK{results: []fakeResult{{}, {Err: pgstore.ErrConflict}}}, wantFound: true,
			wantErr: "SubmitMany item 1: " + pgstore.ErrConflict.Error()},
		{name: "short", given: manyOK{results: []fakeResult{{}}}, wantFound: true,
			wantErr: "SubmitMany returned 1 results for 2 tasks"},
		{name: "call error", given: manyErr{}, wantFound: true, wantErr: "database down"},
		{name: "other input", given: manyWrongIn{}},
		{name: "results without Err", given: manyNoErr{}},
		{name: "no method", given: manyNone{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, found := submitManyOf(reflect.ValueOf(tt.given))
			if found != tt.wantFound {
				t.Fatalf("found = %v, want %v", found, tt.wantFound)
			}
			if !found {
				return
			}
			err := callSubmitMany(context.Background(), m, tasks)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("err = %v, want nil", err)
			case tt.wantErr != "" && (err == nil || err.Error() != tt.wantErr):
				t.Errorf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
}
