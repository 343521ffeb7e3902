// Command library is the README's "Use it as a library" section as a whole
// program. It lives in a module of its own (example.com/dlxlibrary, with a
// replace to the repository root), so it can use only what dlxbridge exports,
// as any other module would.
//
// It declares the topology of config.yaml on $RABBITMQ_URL (default
// amqp://guest:guest@127.0.0.1:5672/), runs a handler for orders.created v2
// with an upcaster from v1, publishes one order of each version through the
// validating publisher, and exits once both are shipped:
//
//	cd examples/library && go run .
//
// -in-code uses the same configuration built in Go instead of config.yaml;
// -prefix puts a prefix on every queue, exchange and connection name.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"sync"
	"time" // for the config written in code, further down

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/consumer"
	"github.com/dlxbridge/dlxbridge/publisher"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/triage"
)

func main() {
	inCode := flag.Bool("in-code", false, "build the configuration in Go instead of loading config.yaml")
	prefix := flag.String("prefix", "", "prefix for every queue, exchange and connection name")
	limit := flag.Duration("for", 30*time.Second, "give up if the orders are not shipped by then")
	flag.Parse()
	url := os.Getenv("RABBITMQ_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	ctx, cancel := context.WithTimeout(context.Background(), *limit)
	defer cancel()
	if err := run(ctx, url, *prefix, *inCode); err != nil {
		fmt.Fprintln(os.Stderr, "library:", err)
		os.Exit(1)
	}
}

// Order is the part of orders.created v2 that shipping reads.
type Order struct {
	OrderID   string `json:"orderId"`
	LineItems []struct {
		SKU      string `json:"sku"`
		Quantity int    `json:"quantity"`
	} `json:"lineItems"`
	Total struct{ Amount, Currency string } `json:"total"`
}

func run(ctx context.Context, url, prefix string, inCode bool) error {
	cfg, err := config.Load("config.yaml")
	if inCode {
		cfg, err = configInCode()
	}
	if err != nil {
		return err
	}
	if err := isolate(cfg, prefix); err != nil {
		return err
	}
	registry, err := schemas.Load(schemas.LoadOptions{Dir: cfg.Schemas.Dir})
	if err != nil {
		return err
	}
	conn, err := publisher.Dial(url, cfg.Broker.ConnectionName+"/app")
	if err != nil {
		return err
	}
	defer conn.Close()

	// Declare the work queue, its retry lanes and its quarantine. Apply is
	// idempotent and declares nothing if an object conflicts.
	topo, err := topology.BuildFor(cfg, conn)
	if err != nil {
		return err
	}
	if _, err := (&topology.Broker{Conn: conn}).Apply(ctx, topo); err != nil {
		return err
	}

	// Publish one order of each version; they wait in the queue.
	orders := cfg.Queues[0]
	pub, err := publisher.New(conn, publisher.Config{Registry: registry})
	if err != nil {
		return err
	}
	defer pub.Close()
	for _, m := range []publisher.Message{
		{Type: "orders.created", Version: "2", Body: []byte(orderV2), MessageID: "order-v2"},
		{Type: "orders.created", Version: "1", Body: []byte(orderV1), MessageID: "order-v1"},
	} {
		err := pub.Publish(ctx, orders.Exchange.Name, "order.created", m)
		if errors.Is(err, publisher.ErrUnroutable) {
			return fmt.Errorf("no queue is bound for order.created: %w", err)
		}
		if err != nil {
			return err
		}
	}

	// ship stands for the service's own work. Delivery is at least once, so
	// it counts idempotency keys, and ends the run once both orders shipped.
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var mu sync.Mutex
	pending := map[string]bool{"order-v2": true, "order-v1": true}
	ship := func(ctx context.Context, key string, order Order) error {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf("shipped order %s (key %s): %d line(s), total %s %s\n",
			order.OrderID, key, len(order.LineItems), order.Total.Amount, order.Total.Currency)
		delete(pending, key)
		if len(pending) == 0 {
			stop()
		}
		return nil
	}

	c, err := consumer.New(&consumer.Config{
		URL: url, File: cfg, Registry: registry,
		Registerer: prometheus.DefaultRegisterer, Logger: slog.Default(),
		OnSettled: func(s consumer.Settled) { // every outcome once settled; runs on the worker: keep it fast
			slog.Info("settled", "id", s.MessageID, "outcome", s.Outcome, "class", s.Class, "attempt", s.Attempt)
		},
	})
	if err != nil {
		return err
	}
	err = c.HandleVersion(orders.Name, "orders.created", "2", consumer.HandlerFunc(
		func(ctx context.Context, m *consumer.Message) error {
			var order Order
			if err := m.Bind(&order); err != nil {
				return triage.Permanent(err)
			}
			return ship(ctx, m.IdempotencyKey, order) // plain error: retried with backoff
		}))
	if err != nil {
		return err
	}
	if err := c.Upcast("orders.created", "1", "2", upcastV1); err != nil {
		return err
	}
	err = c.Run(ctx) // reconnects with backoff; drains in-flight handlers when ctx ends
	if err != nil {
		return err
	}

	mu.Lock()
	defer mu.Unlock()
	if len(pending) > 0 {
		return fmt.Errorf("%d order(s) not shipped in time", len(pending))
	}
	fmt.Println("both orders shipped")
	return nil
}

// configInCode is config.yaml built in Go. Complete applies the defaults and
// checks config.Load applies to a file.
func configInCode() (*config.Config, error) {
	noJitter := 0.0
	cfg := &config.Config{
		Broker: config.Broker{ConnectionName: "dlxlibrary"},
		Queues: []config.Queue{{
			Name:     "library.orders",
			Exchange: config.Exchange{Name: "library.orders", Type: "topic"},
			Bindings: []string{"order.created"},
			Retry:    config.Retry{Tiers: []time.Duration{time.Second}, Jitter: &noJitter},
			Accepts:  []config.Accept{{Type: "orders.created", Versions: []string{"1", "2"}}},
		}},
	}
	if err := cfg.Complete(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// isolate puts prefix on every name the example declares or shows, so runs
// (the tests' among them) don't share queues.
func isolate(cfg *config.Config, prefix string) error {
	if prefix == "" {
		return nil
	}
	cfg.Broker.ConnectionName = prefix + cfg.Broker.ConnectionName
	for i := range cfg.Queues {
		q := &cfg.Queues[i]
		q.Name = prefix + q.Name
		q.Exchange.Name = prefix + q.Exchange.Name
		q.Quarantine.Queue = prefix + q.Quarantine.Queue
	}
	return cfg.Validate()
}

// upcastV1 turns orders.created v1 (items, totalCents in EUR) into v2
// (lineItems, total as money).
func upcastV1(data any) (any, error) {
	v1, ok := data.(map[string]any)
	if !ok {
		return nil, errors.New("orders.created v1: not an object")
	}
	cents, ok := v1["totalCents"].(json.Number)
	if !ok {
		return nil, errors.New("orders.created v1: no totalCents")
	}
	n, err := cents.Int64()
	if err != nil {
		return nil, err
	}
	v2 := maps.Clone(v1)
	delete(v2, "items")
	delete(v2, "totalCents")
	v2["lineItems"] = v1["items"]
	v2["total"] = map[string]any{"amount": fmt.Sprintf("%d.%02d", n/100, n%100), "currency": "EUR"}
	return v2, nil
}

const (
	orderV2 = `{"orderId":"1d2c3b4a-5e6f-4a7b-8c9d-0e1f2a3b4c5d","createdAt":"2026-12-01T09:00:00Z",
 "customer":{"id":"c-21","email":"lin@example.com"},
 "lineItems":[{"sku":"MUG-007","quantity":2,"unitPrice":{"amount":"6.00","currency":"EUR"}}],
 "total":{"amount":"12.00","currency":"EUR"}}`
	orderV1 = `{"orderId":"9e8d7c6b-5a4f-4e3d-9c2b-1a0f9e8d7c6b","createdAt":"2026-12-01T09:01:00Z",
 "customer":{"id":"c-22","email":"sam@example.com"},
 "items":[{"sku":"TEA-003","quantity":1}],"totalCents":450}`
)
