package consumer

import (
	"context"
	"errors"
	"maps"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

func TestRouterPrefersExactThenUpcastThenType(t *testing.T) {
	t.Parallel()
	named := func(name string) Handler {
		return HandlerFunc(func(ctx context.Context, m *Message) error { return errors.New(name) })
	}
	r := newRouter()
	r.byVersion[routeKey{"orders.created", "2"}] = named("v2")
	r.byType["orders.cancelled"] = named("any-cancelled")
	r.upcasts[upcastKey{"orders.created", "1"}] = upcaster{to: "2", fn: func(d any) (any, error) { return d, nil }}

	cases := []struct {
		typ, version string
		want         string
		wantVersion  string
		chain        int
	}{
		{"orders.created", "2", "v2", "2", 0},
		{"orders.created", "1", "v2", "2", 1},
		{"orders.cancelled", "7", "any-cancelled", "7", 0},
	}
	for _, c := range cases {
		h, v, chain, err := r.route(c.typ, c.version)
		if err != nil {
			t.Fatalf("%s v%s: %v", c.typ, c.version, err)
		}
		if got := h.Handle(context.Background(), nil).Error(); got != c.want || v != c.wantVersion || len(chain) != c.chain {
			t.Errorf("%s v%s: handler %s version %s chain %d; want %s %s %d", c.typ, c.version, got, v, len(chain), c.want, c.wantVersion, c.chain)
		}
	}
	// No handler (v3 has no upcaster to v2, and no type-wide handler) is a
	// permanent failure: retrying cannot make a handler appear.
	_, _, _, err := r.route("orders.created", "3")
	if class, _ := triage.Classify(err); class != triage.ClassPermanent {
		t.Fatalf("missing handler: class %q (err %v), want permanent", class, err)
	}
}

func TestRouterStopsOnUpcastCycle(t *testing.T) {
	t.Parallel()
	r := newRouter()
	id := func(d any) (any, error) { return d, nil }
	r.upcasts[upcastKey{"t", "1"}] = upcaster{to: "2", fn: id}
	r.upcasts[upcastKey{"t", "2"}] = upcaster{to: "1", fn: id}
	if _, _, _, err := r.route("t", "1"); err == nil {
		t.Fatal("a cycle of upcasters with no handler must not route")
	}
}

func TestRepublishMovesExpirationAndUserIDIntoHeaders(t *testing.T) {
	t.Parallel()
	d := &amqp.Delivery{
		Headers:     amqp.Table{"a": "1"},
		Expiration:  "60000",
		UserId:      "alice",
		ContentType: "application/json",
		MessageId:   "m-1",
		Type:        "orders.created",
		Body:        []byte(`{"x":1}`),
	}
	h := maps.Clone(d.Headers)
	h["b"] = "2"
	p := frame.Republish(d, h, d.Body)
	if p.Expiration != "" || p.UserId != "" {
		t.Fatalf("expiration %q user %q must not be copied as properties", p.Expiration, p.UserId)
	}
	if p.Headers[wire.HeaderOriginalExpiration] != "60000" || p.Headers[wire.HeaderOriginalUserID] != "alice" {
		t.Fatalf("headers %v lack the moved properties", p.Headers)
	}
	if p.Headers["a"] != "1" || p.Headers["b"] != "2" || d.Headers["b"] != nil {
		t.Fatalf("headers %v (original %v): want a copy with both", p.Headers, d.Headers)
	}
	if p.DeliveryMode != amqp.Persistent || p.MessageId != "m-1" || p.Type != "orders.created" || string(p.Body) != `{"x":1}` {
		t.Fatalf("properties not carried: %+v", p)
	}
}

func TestIdempotencyKeyFallsBackToMessageID(t *testing.T) {
	t.Parallel()
	if got := idempotencyKey(&amqp.Delivery{MessageId: "m"}); got != "m" {
		t.Fatalf("got %q", got)
	}
	if got := idempotencyKey(&amqp.Delivery{MessageId: "m", Headers: amqp.Table{wire.HeaderIdempotencyKey: "k"}}); got != "k" {
		t.Fatalf("got %q", got)
	}
}

func TestRetryHeadersDropBrokerOwnedHeaders(t *testing.T) {
	t.Parallel()
	in := amqp.Table{
		"x-death":                  []any{amqp.Table{"queue": "orders", "reason": "expired", "count": int64(1)}},
		"x-first-death-queue":      "orders",
		"x-first-death-reason":     "expired",
		"x-last-death-queue":       "orders",
		"x-delivery-count":         int64(3),
		"x-acquired-count":         int64(4),
		"traceparent":              "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		wire.HeaderAttempts:        int64(2),
		"x-custom-app-header":      "kept",
		wire.HeaderIdempotencyKey:  "k",
		"dlxbridge-original-queue": "orders",
	}
	out := frame.StripHeaders(in, nil, frame.CopyRoom)
	for _, gone := range []string{"x-death", "x-first-death-queue", "x-first-death-reason", "x-last-death-queue", "x-delivery-count", "x-acquired-count"} {
		if _, ok := out[gone]; ok {
			t.Errorf("%s survived", gone)
		}
	}
	for _, kept := range []string{"traceparent", wire.HeaderAttempts, "x-custom-app-header", wire.HeaderIdempotencyKey, "dlxbridge-original-queue"} {
		if _, ok := out[kept]; !ok {
			t.Errorf("%s was dropped", kept)
		}
	}
	if _, ok := in["x-death"]; !ok {
		t.Error("input modified")
	}
}
