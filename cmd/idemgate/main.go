// Command idemgate is the operator CLI for services that use idemgate:
// the schema of pgstore and pgrecords (migrate up, status, sql), the
// idempotency records in Redis or Postgres (records show, release) and
// the task queue (tasks list, show, retry, cancel, limits, pause,
// resume).
//
//	go install github.com/idemgate/idemgate/cmd/idemgate@latest
//	DATABASE_URL=postgres://… idemgate migrate status
//	REDIS_URL=redis://… idemgate records show -store redis -tenant acme -user alice -request-id R -kind images
//
// It exits 0 on success, 1 on an error ("not found" is one) and 2 on bad
// usage; every command that prints takes -json. See docs/operations.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/internal/cli"
)

func main() {
	// go-redis logs each failed dial to stderr; the command says once
	// what failed.
	redis.SetLogger(quiet{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The first Ctrl-C ends the command (a confirmed records release
	// finishes first); a second one ends the process at once.
	context.AfterFunc(ctx, stop)
	code := cli.Main(ctx, os.Args[1:], cli.Env{
		Prog: "idemgate", Getenv: os.Getenv,
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		StdinIsTerminal: cli.StdinIsTerminal(os.Stdin),
	})
	stop()
	os.Exit(code)
}

// quiet is a go-redis logger that says nothing.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
