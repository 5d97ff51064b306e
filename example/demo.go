package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/idemgate/idemgate/example/imageclient"
)

func cmdDemo(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", "Tells the retry story step by step against a running server (-url), or an\n"+
		"embedded one on a free loopback port when -url is empty.", stderr)
	var s settings
	baseURL := fs.String("url", getenv("DEMO_URL"), "URL of a running server (env DEMO_URL); empty: start an embedded one")
	out := fs.String("out", "", "folder for the images; empty: a new temporary folder")
	s.addStoreFlags(fs, getenv, true)
	s.addWorkerFlags(fs, getenv, 2)
	if err := parse(fs, args); err != nil {
		return err
	}
	secret := secretOrDev(s.jwtSecret, stderr)
	if *baseURL == "" {
		s.addr = "127.0.0.1:0"
		logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		n, err := startNode(ctx, s, logger, io.Discard)
		if err != nil {
			return err
		}
		defer n.shutdown()
		*baseURL = n.url()
		fmt.Fprintf(stdout, "Started an embedded server on %s\n  postgres: %s\n  redis:    %s\n\n", *baseURL, n.b.pgInfo, n.b.redisInfo)
	}
	dir := *out
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "idemgate-demo-"); err != nil {
			return err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tok, err := mintToken(secret, "acme", "alice", time.Now(), time.Hour)
	if err != nil {
		return err
	}
	return demoStory(ctx, stdout, *baseURL, tok, dir)
}

// demoStory is the seed's scenario: a submit, a retry after a lost answer,
// a reworded prompt under the same id, a new id, and polling to success.
func demoStory(ctx context.Context, w io.Writer, baseURL, token, dir string) error {
	c := imageclient.New(imageclient.Config{BaseURL: baseURL, Token: token})
	run := make([]byte, 3)
	_, _ = rand.Read(run)
	action := "poster:launch-" + hex.EncodeToString(run)
	req := imageclient.ImageRequest{Prompt: "a lighthouse at dawn, watercolor", AspectRatio: "16:9", N: 2,
		ClientNote: "first try"}
	id := imageclient.RequestID(action, req)
	step := func(n int, format string, args ...any) {
		fmt.Fprintf(w, "%d. %s\n", n, fmt.Sprintf(format, args...))
	}

	step(1, "Submit %q (16:9, n=2) as tenant acme, user alice,\n   Idempotency-Key: %s", req.Prompt, id)
	first, err := c.SubmitImages(ctx, id, req)
	if err != nil {
		return fmt.Errorf("step 1: %w", err)
	}
	fmt.Fprintf(w, "   → 202 Accepted: task %s, status %s, poll after %v, Location %s\n\n",
		first.TaskID, first.Status, first.PollAfter, first.Location)

	step(2, "The client timed out before it read that answer, so it retries the same\n"+
		"   request under the same key (only client_note, which is not fingerprinted, changed)")
	retry := req
	retry.ClientNote = "retry after timeout"
	again, err := c.SubmitImages(ctx, id, retry)
	if err != nil {
		return fmt.Errorf("step 2: %w", err)
	}
	same := "the SAME task"
	if again.TaskID != first.TaskID {
		same = "a DIFFERENT task (unexpected!)"
	}
	fmt.Fprintf(w, "   → 202 Accepted: task %s — %s; Idempotent-Replayed: %v; nothing ran twice\n\n",
		again.TaskID, same, again.Replayed)

	step(3, "The user rewords the prompt, and the client wrongly keeps the key")
	reworded := req
	reworded.Prompt = "a lighthouse at dusk, watercolor"
	_, err = c.SubmitImages(ctx, id, reworded)
	var p *imageclient.Problem
	switch {
	case errors.Is(err, imageclient.ErrKeyReused) && errors.As(err, &p):
		fmt.Fprintf(w, "   → %d %s, code %s: the key belongs to other parameters. Nothing was generated,\n"+
			"     nothing of the first answer was replayed, and the client does not retry.\n\n",
			p.Status, http.StatusText(p.Status), p.Code)
	case err == nil:
		return errors.New("step 3: a reworded prompt under the same key was accepted")
	default:
		return fmt.Errorf("step 3: %w", err)
	}

	newID := imageclient.RequestID(action, reworded)
	step(4, "Changed parameters need a new key: %s", newID)
	second, err := c.SubmitImages(ctx, newID, reworded)
	if err != nil {
		return fmt.Errorf("step 4: %w", err)
	}
	fmt.Fprintf(w, "   → 202 Accepted: a new task %s\n\n", second.TaskID)

	step(5, "Poll the first task (the same id, at the pace the server asks for)")
	var states []string
	wait := first.PollAfter
	var task imageclient.Task
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		task, err = c.Task(ctx, first.TaskID)
		if err != nil {
			return fmt.Errorf("step 5: %w", err)
		}
		if len(states) == 0 || states[len(states)-1] != task.Status {
			states = append(states, task.Status)
		}
		if task.Done() {
			break
		}
		wait = task.PollAfter
	}
	fmt.Fprintf(w, "   → %s\n", strings.Join(states, " → "))
	if task.Status != "succeeded" {
		return fmt.Errorf("step 5: task %s ended %s: %s", task.ID, task.Status, task.Error)
	}
	pngs, err := task.PNGs()
	if err != nil {
		return fmt.Errorf("step 5: %w", err)
	}
	for i, b := range pngs {
		name := filepath.Join(dir, fmt.Sprintf("%s-%d.png", task.ID, i+1))
		if err := os.WriteFile(name, b, 0o644); err != nil {
			return err
		}
		fmt.Fprintf(w, "   wrote %s (%d bytes)\n", name, len(b))
	}
	fmt.Fprintln(w, "\nOne business action, one task, one set of images — however often the client retried.")
	return nil
}
