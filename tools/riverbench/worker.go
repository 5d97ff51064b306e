package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/idemgate/idemgate/pgstore"
	"github.com/idemgate/idemgate/tools/internal/measure"
)

// workerMain is the worker subcommand: it works on one system's tasks
// with a no-op handler until its standard input closes (the parent is
// done or gone), then shuts down gracefully. It prints "ready N" once
// working, "start KEY UNIXNANO" as each handler starts (with -report),
// and "done N" when its input closes, N being its round trips so far.
func workerMain(args []string) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	sys := fs.String("system", "", "pgstore, river-tuned or river-default")
	dsn := fs.String("dsn", "", "database to work on")
	slots := fs.Int("slots", 16, "tasks run at once")
	report := fs.Bool("report", false, "print each handler start")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole process to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	stopProfile, err := measure.StartCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool, rt, err := newPool(ctx, *dsn, workerConns(*slots))
	if err != nil {
		return err
	}
	defer pool.Close()

	var out sync.Mutex
	started := func(key string) {
		if !*report {
			return
		}
		now := time.Now().UnixNano()
		out.Lock()
		defer out.Unlock()
		fmt.Fprintf(os.Stdout, "start %s %d\n", key, now)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	var stop func() error
	switch *sys {
	case sysPgstore:
		s, err := pgstore.New(ctx, pool)
		if err != nil {
			return err
		}
		w, err := pgstore.NewWorker(s, pgstore.WorkerConfig{
			Concurrency: *slots,
			Logger:      logger,
			Handler: func(_ context.Context, t pgstore.Task) pgstore.Outcome {
				started(t.IdempotencyKey)
				return pgstore.Succeeded(json.RawMessage("true"))
			},
		})
		if err != nil {
			return err
		}
		runCtx, stopRun := context.WithCancel(ctx)
		ran := make(chan error, 1)
		go func() { ran <- w.Run(runCtx) }()
		stop = func() error { stopRun(); return <-ran }
	case sysRiverTuned, sysRiverDefault:
		workers := river.NewWorkers()
		river.AddWorker(workers, river.WorkFunc(func(_ context.Context, j *river.Job[noopArgs]) error {
			started(j.Args.Key)
			return nil
		}))
		cfg := riverConfig(*sys, workers, *slots)
		cfg.Logger = logger
		c, err := river.NewClient(riverpgxv5.New(pool), cfg)
		if err != nil {
			return err
		}
		if err := c.Start(ctx); err != nil {
			return err
		}
		stop = func() error {
			sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			return c.Stop(sctx)
		}
	default:
		return fmt.Errorf("unknown system %q", *sys)
	}
	out.Lock()
	fmt.Fprintf(os.Stdout, "ready %d\n", rt.Load())
	out.Unlock()
	_, _ = io.Copy(io.Discard, os.Stdin)
	out.Lock()
	fmt.Fprintf(os.Stdout, "done %d\n", rt.Load())
	out.Unlock()
	return stop()
}

// workerConns is the pool size of a worker process with slots slots, the
// same for every system.
func workerConns(slots int) int { return slots + 4 }

// workerProc is a running worker subprocess.
type workerProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited chan struct{}
	err    error // of Wait, once exited is closed
	// trips are the round trips from ready until its input closed, and
	// cpu the process's user and system time, once exited is closed.
	trips int64
	cpu   time.Duration
}

// spawnWorker starts the worker subcommand of exe for sys and waits until
// it reports ready. onStart, if not nil, receives each handler start. With
// profileDir, the worker writes a CPU profile there.
func spawnWorker(ctx context.Context, exe, sys, dsn string, slots int, profileDir string,
	onStart func(key string, at time.Time)) (*workerProc, error) {
	args := []string{"worker", "-system", sys, "-dsn", dsn, "-slots", strconv.Itoa(slots)}
	if onStart != nil {
		args = append(args, "-report")
	}
	if profileDir != "" {
		f, err := os.CreateTemp(profileDir, sys+"-*.pprof")
		if err != nil {
			return nil, err
		}
		f.Close()
		args = append(args, "-cpuprofile", filepath.Clean(f.Name()))
	}
	cmd := exec.Command(exe, args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker: %w", err)
	}
	p := &workerProc{cmd: cmd, stdin: stdin, exited: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		var atReady int64
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 2 && f[0] == "ready":
				atReady, _ = strconv.ParseInt(f[1], 10, 64)
				close(ready)
			case len(f) == 2 && f[0] == "done":
				n, _ := strconv.ParseInt(f[1], 10, 64)
				p.trips = n - atReady
			case len(f) == 3 && f[0] == "start" && onStart != nil:
				if ns, err := strconv.ParseInt(f[2], 10, 64); err == nil {
					onStart(f[1], time.Unix(0, ns))
				}
			}
		}
		p.err = cmd.Wait()
		if cmd.ProcessState != nil {
			p.cpu = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		}
		close(p.exited)
	}()
	timeout := time.NewTimer(time.Minute)
	defer timeout.Stop()
	select {
	case <-ready:
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("worker %s exited before ready: %v", sys, p.err)
	case <-timeout.C:
		_ = p.stop()
		return nil, fmt.Errorf("worker %s not ready within a minute", sys)
	case <-ctx.Done():
		_ = p.stop()
		return nil, ctx.Err()
	}
}

// stop closes the worker's input, which shuts it down, and waits for it
// to exit; after 30 s it is killed.
func (p *workerProc) stop() error {
	_ = p.stdin.Close()
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return errors.New("worker did not stop within 30s; killed")
	}
	return p.err
}
