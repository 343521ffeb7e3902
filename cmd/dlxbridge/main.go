// Command dlxbridge plans, applies and verifies the RabbitMQ dead-letter
// topology (dlxbridge topology) and lists, lints and validates against the
// schema registry (dlxbridge schemas). The runtime that consumes the queues
// is package consumer, which the host program runs. See README.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], &cli.Env{Stdout: os.Stdout, Stderr: os.Stderr, Stdin: os.Stdin})
	stop()
	os.Exit(code)
}
