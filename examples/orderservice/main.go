// Command orderservice is a runnable example of a service on the dlxbridge
// runtime: two queues, three handlers, an upcaster, and a demo publisher
// that shows each outcome.
//
//	go run ./cmd/dlxbridge topology apply      # declare the topology once
//	go run ./examples/orderservice -demo       # consume, and publish demo messages
//
// With -demo it publishes, through the validating publisher:
//   - an orders.created v2 order (handled on the first attempt);
//   - an orders.created v1 order (upcast to v2 before the handler sees it);
//   - a notifications.email whose first attempt fails (retried, then handled);
//   - an order the handler refuses permanently (quarantined with an envelope);
//   - a message that is not valid (refused by the publisher, never sent).
//
// Metrics are served on -metrics (default 127.0.0.1:9464) at /metrics.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/publisher"
)

func main() {
	configPath := flag.String("config", "config.yaml", "config file")
	url := flag.String("url", "", "AMQP URL (default $RABBITMQ_URL, else the local broker)")
	demo := flag.Bool("demo", false, "publish demo messages, print what happened, and exit")
	metricsAddr := flag.String("metrics", "127.0.0.1:9464", "address to serve /metrics on (empty: off)")
	flag.Parse()
	if *url == "" {
		*url = os.Getenv("RABBITMQ_URL")
	}
	if *url == "" {
		*url = publisher.DefaultURL
	}
	cfg, err := config.Load(*configPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "orderservice: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	reg := prometheus.NewRegistry()
	if *metricsAddr != "" {
		srv := &http.Server{Addr: *metricsAddr, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})}
		go func() { _ = srv.ListenAndServe() }()
		defer srv.Close()
	}
	opts := Options{URL: *url, File: cfg, Registerer: reg, Logger: slog.Default(), Demo: *demo}
	if err := Run(ctx, opts, os.Stdout); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(os.Stderr, "orderservice: %v\n", err) // dlxbridge's errors never quote a URL
		os.Exit(1)
	}
}

// Options configures Run.
type Options struct {
	URL        string
	File       *config.Config
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Demo publishes the demo messages and returns once every one of them
	// was settled.
	Demo bool
	// OrdersQueue and NotificationsQueue name the two queues in File.
	// Default to "orders" and "notifications".
	OrdersQueue, NotificationsQueue string
}
