package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/sidecar"
	"github.com/dlxbridge/dlxbridge/schemas"
)

// runRun: dlxbridge run, the sidecar. It verifies the topology (refusing to
// start on drift unless --apply or --allow-drift), serves /metrics,
// /healthz and /readyz on run.listen, and forwards every queue's validated
// messages to queues[].forward.url until SIGINT or SIGTERM, then drains and
// exits 0. Exit 2: bad usage or config (a queue without forward.url
// included); 1: the broker refused, the topology drifted, or the runtime
// gave up.
func runRun(ctx context.Context, env *Env, args []string) int {
	fs := newFlagSet(env, "run", "run [--config config.yaml] [--url amqp://...] [--apply | --allow-drift] [--listen host:port] [--quarantine-refresh 30s]")
	var c common
	c.register(fs, env)
	apply := fs.Bool("apply", false, "declare missing topology before verifying it (refuses on a conflicting object)")
	allowDrift := fs.Bool("allow-drift", false, "start even if the topology differs from the config (logs the drift)")
	listen := fs.String("listen", "", "address for /metrics, /healthz, /readyz (default run.listen)")
	qrefresh := fs.Duration("quarantine-refresh", 30*time.Second, "how often the quarantine metrics read the records (each read takes every record)")
	if code, ok := parseCommand(env, fs, "run", args); !ok {
		return code
	}
	if *apply && *allowDrift {
		fmt.Fprintln(env.Stderr, "dlxbridge run: --apply and --allow-drift exclude each other")
		return ExitUsage
	}
	cfg, ok := loadConfig(env, c.configPath)
	if !ok {
		return ExitUsage
	}
	if *listen != "" {
		if _, _, err := net.SplitHostPort(*listen); err != nil {
			fmt.Fprintf(env.Stderr, "dlxbridge run: --listen %q is not host:port (say 127.0.0.1:9180, or :9180 for every interface)\n", *listen)
			return ExitUsage
		}
		cfg.Run.Listen = *listen
	}
	missing := false
	for i, q := range cfg.Queues {
		if q.Forward.URL == "" {
			fmt.Fprintf(env.Stderr, "dlxbridge run: %s: queues[%d].forward.url is required (where queue %q's messages go)\n", c.configPath, i, q.Name)
			missing = true
		}
	}
	if missing {
		return ExitUsage
	}
	url, ok := c.checkedURL(env, "run")
	if !ok {
		return ExitUsage
	}
	reg, err := schemas.Load(schemas.LoadOptions{Dir: cfg.Schemas.Dir})
	if err != nil {
		fmt.Fprintf(env.Stderr, "dlxbridge run: schemas: %v\n", err)
		return ExitUsage
	}
	mode := sidecar.TopologyVerify
	switch {
	case *apply:
		mode = sidecar.TopologyApply
	case *allowDrift:
		mode = sidecar.TopologyAllowDrift
	}
	logger := slog.New(slog.NewTextHandler(env.Stderr, nil))
	tp, stopTracing, err := otlpTracing(ctx, env, "dlxbridge")
	if err != nil {
		fmt.Fprintf(env.Stderr, "dlxbridge run: tracing: %v\n", err)
		return ExitUsage
	}
	defer stopTracing()
	if *qrefresh <= 0 {
		fmt.Fprintln(env.Stderr, "dlxbridge run: --quarantine-refresh must be positive")
		return ExitUsage
	}
	page, ok := runPage(env, url, cfg, reg, logger)
	if !ok {
		return ExitUsage
	}
	err = sidecar.Run(ctx, sidecar.Options{URL: url, Config: cfg, Registry: reg, Logger: logger, Topology: mode, TracerProvider: tp,
		QuarantineRefresh: *qrefresh, Page: page})
	if err != nil {
		fmt.Fprintf(env.Stderr, "dlxbridge run: %v\n", err)
		return ExitFail
	}
	return ExitOK
}
