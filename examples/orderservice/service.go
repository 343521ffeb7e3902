package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/dlxbridge/dlxbridge/consumer"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
)

// OrderV2 is the handler's view of orders.created v2.
type OrderV2 struct {
	OrderID   string `json:"orderId"`
	LineItems []struct {
		SKU      string `json:"sku"`
		Quantity int    `json:"quantity"`
	} `json:"lineItems"`
	Total struct {
		Amount   string `json:"amount"`
		Currency string `json:"currency"`
	} `json:"total"`
	Note string `json:"note"`
}

// upcastOrderV1 turns orders.created v1 (totalCents in EUR, items) into v2
// (total as money, lineItems). v1 had no unit prices, so none are set.
func upcastOrderV1(data any) (any, error) {
	v1, ok := data.(map[string]any)
	if !ok {
		return nil, errors.New("orders.created v1: not an object")
	}
	cents, ok := v1["totalCents"].(json.Number)
	if !ok {
		return nil, errors.New("orders.created v1: totalCents missing")
	}
	c, err := cents.Int64()
	if err != nil {
		return nil, err
	}
	v2 := map[string]any{}
	for k, v := range v1 {
		switch k {
		case "totalCents":
		case "items":
			v2["lineItems"] = v
		default:
			v2[k] = v
		}
	}
	v2["total"] = map[string]any{"amount": fmt.Sprintf("%d.%02d", c/100, c%100), "currency": "EUR"}
	return v2, nil
}

// Run consumes the two queues until ctx ends (or, with Demo, until the demo
// is done), printing what the handlers do to out.
func Run(ctx context.Context, o Options, out io.Writer) error {
	if o.OrdersQueue == "" {
		o.OrdersQueue = "orders"
	}
	if o.NotificationsQueue == "" {
		o.NotificationsQueue = "notifications"
	}
	registry, err := schemas.Load(schemas.LoadOptions{Dir: o.File.Schemas.Dir})
	if err != nil {
		return err
	}
	c, err := consumer.New(&consumer.Config{URL: o.URL, File: o.File, Registry: registry, Registerer: o.Registerer, Logger: o.Logger})
	if err != nil {
		return err
	}
	var mu sync.Mutex
	printf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, format+"\n", args...)
	}
	events := make(chan string, 16)

	// Handler 1: orders.created, written for v2; v1 arrives upcast.
	if err := c.HandleVersion(o.OrdersQueue, "orders.created", "2", consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		var order OrderV2
		if err := m.Bind(&order); err != nil {
			return triage.Permanent(err)
		}
		if strings.Contains(order.Note, "reject") {
			return triage.Permanent(fmt.Errorf("order %s: customer account is closed", order.OrderID))
		}
		printf("orders.created v%s (sent as v%s): order %s, %d line(s), total %s %s, attempt %d",
			m.Version, m.OriginalVersion, order.OrderID, len(order.LineItems), order.Total.Amount, order.Total.Currency, m.Attempt)
		events <- "order " + order.OrderID
		return nil
	})); err != nil {
		return err
	}
	if err := c.Upcast("orders.created", "1", "2", upcastOrderV1); err != nil {
		return err
	}
	// Handler 2: orders.cancelled, any version.
	if err := c.Handle(o.OrdersQueue, "orders.cancelled", consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		printf("orders.cancelled v%s: %s", m.Version, m.MessageID)
		return nil
	})); err != nil {
		return err
	}
	// Handler 3: e-mails; the mail provider "fails" on the first attempt.
	if err := c.Handle(o.NotificationsQueue, "notifications.email", consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		if m.Attempt == 1 {
			return triage.RetryAfter(400*time.Millisecond, errors.New("mail provider: 503 service unavailable"))
		}
		printf("notifications.email: sent %s on attempt %d", m.IdempotencyKey, m.Attempt)
		events <- "email " + m.IdempotencyKey
		return nil
	})); err != nil {
		return err
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	if !o.Demo {
		return <-done
	}
	err = demo(runCtx, o, registry, events, printf)
	cancel()
	if rerr := <-done; err == nil {
		err = rerr
	}
	return err
}
