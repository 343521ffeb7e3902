package cli

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/sidecar"
	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/schemas"
)

// runPage is `dlxbridge run`'s quarantine page: read-only, unless
// run.operator_token_env names a variable holding the operator token. A
// variable named but empty or unset is a config error (ok false), not a
// silently read-only page; so is a token shorter than
// sidecar.MinTokenBytes, which a few guesses would find.
func runPage(env *Env, url string, cfg *config.Config, reg *schemas.Registry, logger *slog.Logger) (*sidecar.Page, bool) {
	// One dialer for every request's connection: each starts at the node
	// that last answered. It logs nothing: a connection per page view
	// would fill the log, and a failed one is the page's error.
	d, err := amqpx.NewDialer(url)
	if err != nil { // checkedURL passed it
		fmt.Fprintf(env.Stderr, "dlxbridge run: %v\n", err)
		return nil, false
	}
	p := &sidecar.Page{Config: cfg, Registry: reg, Logger: logger,
		Dial: func() (*amqp.Connection, error) {
			conn, _, err := d.Dial(context.Background(), cfg.Broker.ConnectionName+"/run-quarantine-page")
			return conn, err
		}}
	if name := cfg.Run.OperatorTokenEnv; name != "" {
		p.Token = strings.TrimSpace(env.Getenv(name))
		if p.Token == "" {
			fmt.Fprintf(env.Stderr, "dlxbridge run: run.operator_token_env names %s, which is unset or empty\n", name)
			return nil, false
		}
		if len(p.Token) < sidecar.MinTokenBytes {
			fmt.Fprintf(env.Stderr, "dlxbridge run: the operator token in %s is %d bytes, want at least %d (e.g. from: openssl rand -hex 32, as docs/sidecar.md says)\n", name, len(p.Token), sidecar.MinTokenBytes)
			return nil, false
		}
	}
	p.AllowedHosts = cfg.Run.AllowedHosts
	// The runtime's key (the same variable consumer.New reads): the page
	// verifies events with it and signs its own.
	signer, err := envSigner(env.Getenv, cfg)
	if err != nil {
		fmt.Fprintf(env.Stderr, "dlxbridge run: %v\n", err)
		return nil, false
	}
	p.Signer = signer
	return p, true
}
