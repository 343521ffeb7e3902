package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/publisher"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/schemas"
)

const (
	orderV2 = `{"orderId":"6f1c2b9e-3f4a-4d7b-9a51-2c8e0f6d1a10","createdAt":"2026-11-29T10:00:00Z",
 "customer":{"id":"c-17","email":"ada@example.com"},
 "lineItems":[{"sku":"BOOK-001","quantity":2,"unitPrice":{"amount":"12.50","currency":"EUR"}}],
 "total":{"amount":"25.00","currency":"EUR"}}`
	orderV1 = `{"orderId":"0b7d6c5a-1e2f-4a3b-8c9d-0e1f2a3b4c5d","createdAt":"2026-11-29T10:01:00Z",
 "customer":{"id":"c-18","email":"grace@example.com"},
 "items":[{"sku":"PEN-042","quantity":3}],"totalCents":897}`
	orderRejected = `{"orderId":"9a8b7c6d-5e4f-4a3b-9c2d-1e0f9a8b7c6d","createdAt":"2026-11-29T10:02:00Z",
 "customer":{"id":"c-19","email":"closed@example.com"},
 "lineItems":[{"sku":"BOOK-002","quantity":1,"unitPrice":{"amount":"9.99","currency":"EUR"}}],
 "total":{"amount":"9.99","currency":"EUR"},"note":"please reject"}`
	orderInvalid = `{"orderId":"not-a-uuid","customer":{"id":"c-20"}}`
	email        = `{"type":"notifications.email","schemaVersion":"1","data":{
 "notificationId":"3c2b1a09-8f7e-4d6c-b5a4-9382716f5e4d","to":"ada@example.com","template":"order-confirmation","locale":"en-GB"}}`
)

// demo publishes one message of each kind and waits for the handlers and the
// quarantine to show the outcomes.
func demo(ctx context.Context, o Options, registry *schemas.Registry, events <-chan string, printf func(string, ...any)) error {
	conn, err := publisher.Dial(o.URL, o.File.Broker.ConnectionName+"/demo-publisher")
	if err != nil {
		return err
	}
	defer conn.Close()
	orders, _ := o.File.QueueByName(o.OrdersQueue)
	notes, _ := o.File.QueueByName(o.NotificationsQueue)
	orderPub, err := publisher.New(conn, publisher.Config{Registry: registry, AppID: "orderservice-demo"})
	if err != nil {
		return err
	}
	defer orderPub.Close()
	notePub, err := publisher.New(conn, publisher.Config{Registry: registry, Identity: schemas.Identity{From: schemas.FromEnvelope}})
	if err != nil {
		return err
	}
	defer notePub.Close()

	send := func(p *publisher.Publisher, exchange, key string, m publisher.Message) error {
		return p.Publish(ctx, exchange, key, m)
	}
	steps := []struct {
		what string
		err  error
	}{
		{"orders.created v2", send(orderPub, orders.Exchange.Name, "order.created", publisher.Message{Type: "orders.created", Version: "2", Body: []byte(orderV2), MessageID: "demo-order-v2"})},
		{"orders.created v1", send(orderPub, orders.Exchange.Name, "order.created", publisher.Message{Type: "orders.created", Version: "1", Body: []byte(orderV1), MessageID: "demo-order-v1"})},
		{"orders.created v2 (closed account)", send(orderPub, orders.Exchange.Name, "order.created", publisher.Message{Type: "orders.created", Version: "2", Body: []byte(orderRejected), MessageID: "demo-order-rejected"})},
		{"notifications.email", send(notePub, notes.Exchange.Name, "email", publisher.Message{Body: []byte(email), MessageID: "demo-email-1"})},
	}
	for _, s := range steps {
		if s.err != nil {
			return fmt.Errorf("publish %s: %w", s.what, s.err)
		}
	}
	invalid := send(orderPub, orders.Exchange.Name, "order.created", publisher.Message{Type: "orders.created", Version: "2", Body: []byte(orderInvalid)})
	var verr *schemas.ValidationError
	if !errors.As(invalid, &verr) {
		return fmt.Errorf("the invalid order was not refused: %v", invalid)
	}
	printf("publisher refused an invalid orders.created v2 (%d violations); nothing was sent", len(verr.Violations))

	want := map[string]bool{
		"order 6f1c2b9e-3f4a-4d7b-9a51-2c8e0f6d1a10": true,
		"order 0b7d6c5a-1e2f-4a3b-8c9d-0e1f2a3b4c5d": true,
		"email demo-email-1":                         true,
	}
	timeout := time.After(30 * time.Second)
	for len(want) > 0 {
		select {
		case e := <-events:
			delete(want, e)
		case <-timeout:
			return fmt.Errorf("demo: still waiting for %v", want)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// The closed-account order is quarantined right after its only attempt;
	// the runtime's keeper moves it from the intake into the records stream.
	in := &quarantine.Inspector{Conn: conn, Config: o.File}
	deadline := time.Now().Add(15 * time.Second)
	for {
		snap, err := in.Snapshot(ctx)
		if err != nil {
			return err
		}
		if groups := snap.Stats(quarantine.Filter{Queue: orders.Name}); len(groups) > 0 {
			for _, g := range groups {
				printf("quarantine stats: %s %s fingerprint %s: %d open (%s)", g.Queue, g.Class, g.Fingerprint, g.Open, g.Example)
			}
			printf("see them with: dlxbridge quarantine stats (or list, show ID)")
			return replayGroup(ctx, conn, o, registry, in, groups[0], printf)
		}
		if time.Now().After(deadline) {
			return errors.New("demo: the rejected order did not reach the quarantine")
		}
		time.Sleep(100 * time.Millisecond) // polling the broker: a stream has no event to wait on
	}
}

// replayGroup replays one fingerprint group, as `dlxbridge quarantine replay
// --fingerprint F` would. The closed account is still closed, so the order
// comes back to the quarantine, now with redrive count 1.
func replayGroup(ctx context.Context, conn *amqp.Connection, o Options, registry *schemas.Registry, in *quarantine.Inspector, g quarantine.Group, printf func(string, ...any)) error {
	rp := &quarantine.Replayer{Conn: conn, Config: o.File, Registry: registry, By: "orderservice-demo"}
	res, err := rp.Replay(ctx, quarantine.ReplayOptions{Filter: quarantine.Filter{Fingerprint: g.Fingerprint}, Rate: 10, Reason: "demo: account reopened?"})
	if errors.Is(err, quarantine.ErrInvalid) {
		// The quarantine redacted /customer/email (see config.yaml), so the
		// stored body no longer passes the schema: repair it with a patch,
		// as `--patch FILE` would.
		for _, p := range res.Plan {
			printf("replay refused %s: %s", p.ID, p.Refused)
		}
		res, err = rp.Replay(ctx, quarantine.ReplayOptions{Filter: quarantine.Filter{Fingerprint: g.Fingerprint}, Rate: 10,
			Reason: "demo: restore the redacted e-mail", Patch: &quarantine.Patch{Merge: []byte(`{"customer":{"email":"closed@example.com"}}`)}})
	}
	if err != nil {
		return err
	}
	printf("replayed %d record(s) of fingerprint %s", len(res.Sent), g.Fingerprint)
	deadline := time.Now().Add(15 * time.Second)
	for {
		snap, err := in.Snapshot(ctx)
		if err != nil {
			return err
		}
		for _, r := range snap.List(quarantine.Filter{Fingerprint: g.Fingerprint}) {
			if r.Redrives > 0 {
				printf("quarantined again with redrive count %d: %s", r.Redrives, r.Envelope.Reason)
				return nil
			}
		}
		if time.Now().After(deadline) {
			return errors.New("demo: the replayed order did not come back")
		}
		time.Sleep(100 * time.Millisecond) // polling the broker: a stream has no event to wait on
	}
}
