package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/topology"
)

// The example runs end to end on the real broker with the shipped
// config.yaml, its names prefixed for isolation.
func TestDemoShowsEveryOutcome(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	cfg, err := config.Load("../../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for i := range cfg.Queues {
		q := &cfg.Queues[i]
		q.Name = env.Name(q.Name)
		q.Exchange.Name = env.Name(q.Exchange.Name)
		q.Quarantine.Queue = env.Name(q.Quarantine.Queue)
	}
	cfg.SharedTiers.Prefix = env.Prefix // the shared delay tiers too
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	conn := env.Dial("apply")
	topo, err := topology.BuildFor(cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := (&topology.Broker{Conn: conn}).Apply(ctx, topo); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = Run(ctx, Options{
		URL: env.URL, File: cfg, Demo: true,
		OrdersQueue: cfg.Queues[0].Name, NotificationsQueue: cfg.Queues[1].Name,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, &out)
	t.Logf("demo output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"orders.created v2 (sent as v2): order 6f1c2b9e-3f4a-4d7b-9a51-2c8e0f6d1a10, 1 line(s), total 25.00 EUR, attempt 1",
		"orders.created v2 (sent as v1): order 0b7d6c5a-1e2f-4a3b-8c9d-0e1f2a3b4c5d, 1 line(s), total 8.97 EUR, attempt 1",
		"notifications.email: sent demo-email-1 on attempt 2",
		"publisher refused an invalid orders.created v2",
		"permanent fingerprint", ": 1 open (", "replayed 1 record(s) of fingerprint", "quarantined again with redrive count 1",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
