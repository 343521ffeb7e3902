// Command dlxbridge declares and verifies RabbitMQ dead-letter topology,
// validates messages against the schema registry and runs the triage
// runtime. See README.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/dlxbridge/dlxbridge/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], &cli.Env{Stdout: os.Stdout, Stderr: os.Stderr, Stdin: os.Stdin})
	stop()
	os.Exit(code)
}
