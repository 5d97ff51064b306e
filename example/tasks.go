package main

import (
	"context"
	"errors"
	"io"
	"os"

	"github.com/idemgate/idemgate/internal/cli"
)

// cmdTasks runs the operator tools on the task queue: the idemgate
// command's tasks commands (internal/cli), so that the example and the
// CLI never drift apart. Like them it never migrates: run "migrate" (or
// serve) first.
func cmdTasks(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	// retry and cancel ask the person at the terminal for a typed yes.
	err := cli.Tasks(ctx, args, cli.Env{Prog: "go run ./example", Getenv: getenv,
		Stdin: os.Stdin, StdinIsTerminal: cli.StdinIsTerminal(os.Stdin), Stdout: stdout, Stderr: stderr})
	if errors.Is(err, cli.ErrUsage) {
		return errUsage
	}
	return err
}
