package publisher_test

import (
	"context"
	"errors"
	"regexp"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/publisher"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/wire"
)

const orderV1 = `{
  "orderId": "5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7b",
  "createdAt": "2026-11-29T19:13:25Z",
  "customer": {"id": "cus_8842", "email": "jane.doe@example.com"},
  "items": [{"sku": "BOOK-0042", "quantity": 1}],
  "totalCents": 3990
}`

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

type testBundle struct {
	env   *brokertest.Env
	ch    *amqp.Channel // for declaring and inspecting
	pub   *publisher.Publisher
	ex    string
	queue string
}

// setup declares an exchange bound to one queue by "order.created" and a
// Publisher over a named connection.
func setup(t *testing.T, id schemas.Identity) *testBundle {
	t.Helper()
	env := brokertest.Require(t)
	reg, err := schemas.Load(schemas.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b := &testBundle{env: env, ch: env.Channel("setup"), ex: env.Name("orders"), queue: env.Name("orders")}
	env.TrackQueue(b.queue)
	env.TrackExchange(b.ex)
	if err := b.ch.ExchangeDeclare(b.ex, "topic", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ch.QueueDeclare(b.queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := b.ch.QueueBind(b.queue, "order.created", b.ex, false, nil); err != nil {
		t.Fatal(err)
	}
	b.pub, err = publisher.New(env.Dial("publisher"), publisher.Config{Registry: reg, Identity: id, AppID: "publisher-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.pub.Close() })
	return b
}

func (b *testBundle) depth(t *testing.T) int {
	t.Helper()
	q, err := b.ch.QueueDeclarePassive(b.queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

func (b *testBundle) get(t *testing.T) amqp.Delivery {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		d, ok, err := b.ch.Get(b.queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			return d
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("no message arrived")
	return amqp.Delivery{}
}

func TestPublishRefusesInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t, schemas.Identity{})
	ctx := context.Background()
	for name, m := range map[string]publisher.Message{
		"schema violation": {Type: "orders.created", Version: "1", Body: []byte(`{"orderId": "nope"}`)},
		"v1 body as v2":    {Type: "orders.created", Version: "2", Body: []byte(orderV1)},
		"unknown version":  {Type: "orders.created", Version: "9", Body: []byte(orderV1)},
		"no type":          {Version: "1", Body: []byte(orderV1)},
		"duplicate key":    {Type: "orders.created", Version: "1", Body: []byte(`{"totalCents":1,"totalCents":2}`)},
	} {
		err := b.pub.Publish(ctx, b.ex, "order.created", m)
		var verr *schemas.ValidationError
		if !errors.As(err, &verr) {
			t.Errorf("%s: want *schemas.ValidationError, got %v", name, err)
		}
	}
	if n := b.depth(t); n != 0 {
		t.Fatalf("queue depth %d after refused publishes, want 0", n)
	}
	// Nothing was sent: a valid message published after them is the only
	// one in the queue, and it arrives first.
	if err := b.pub.Publish(ctx, b.ex, "order.created", publisher.Message{Type: "orders.created", Version: "1", Body: []byte(orderV1), MessageID: "marker"}); err != nil {
		t.Fatal(err)
	}
	if n := b.depth(t); n != 1 {
		t.Fatalf("queue depth %d, want 1 (only the valid message)", n)
	}
	if d := b.get(t); d.MessageId != "marker" {
		t.Fatalf("first message is %q, want the valid marker", d.MessageId)
	}
}

func TestPublishValid(t *testing.T) {
	t.Parallel()
	b := setup(t, schemas.Identity{})
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{1, 2, 3},
		SpanID:     trace.SpanID{4, 5, 6},
		TraceFlags: trace.FlagsSampled,
	}))
	err := b.pub.Publish(ctx, b.ex, "order.created", publisher.Message{
		Type: "orders.created", Version: "v1", Body: []byte(orderV1),
		CorrelationID: "corr-1", Headers: map[string]any{"tenant": "acme"},
	})
	if err != nil {
		t.Fatal(err)
	}
	d := b.get(t)
	if d.Type != "orders.created" || d.Headers[wire.DefaultVersionHeader] != "1" {
		t.Errorf("type %q, version header %v", d.Type, d.Headers[wire.DefaultVersionHeader])
	}
	if !uuidRE.MatchString(d.MessageId) {
		t.Errorf("message id %q is not a v4 UUID", d.MessageId)
	}
	if d.Headers[wire.HeaderIdempotencyKey] != d.MessageId {
		t.Errorf("idempotency key %v, want the message id %s", d.Headers[wire.HeaderIdempotencyKey], d.MessageId)
	}
	if d.DeliveryMode != amqp.Persistent || d.ContentType != "application/json" || d.AppId != "publisher-test" || d.CorrelationId != "corr-1" {
		t.Errorf("properties: mode %d, content type %q, app id %q, correlation %q", d.DeliveryMode, d.ContentType, d.AppId, d.CorrelationId)
	}
	if d.Timestamp.IsZero() || time.Since(d.Timestamp) > time.Minute {
		t.Errorf("timestamp %v", d.Timestamp)
	}
	if d.Headers["tenant"] != "acme" {
		t.Errorf("caller's header lost: %v", d.Headers)
	}
	if tp, _ := d.Headers["traceparent"].(string); tp != "00-01020300000000000000000000000000-0405060000000000-01" {
		t.Errorf("traceparent %q", tp)
	}
	if string(d.Body) != orderV1 {
		t.Errorf("body changed: %s", d.Body)
	}
}

func TestPublishEnvelope(t *testing.T) {
	t.Parallel()
	b := setup(t, schemas.Identity{From: schemas.FromEnvelope})
	body := `{"type":"orders.created","schemaVersion":"1","data":` + orderV1 + `}`
	ctx := context.Background()
	if err := b.pub.Publish(ctx, b.ex, "order.created", publisher.Message{Body: []byte(body), IdempotencyKey: "k-1"}); err != nil {
		t.Fatal(err)
	}
	d := b.get(t)
	if d.Type != "orders.created" || d.Headers[wire.DefaultVersionHeader] != "1" || d.Headers[wire.HeaderIdempotencyKey] != "k-1" {
		t.Errorf("type %q, headers %v", d.Type, d.Headers)
	}
	err := b.pub.Publish(ctx, b.ex, "order.created", publisher.Message{Type: "orders.cancelled", Body: []byte(body)})
	if err == nil {
		t.Error("a Type that contradicts the envelope was accepted")
	}
}

func TestPublishUnroutable(t *testing.T) {
	t.Parallel()
	b := setup(t, schemas.Identity{})
	lonely := b.env.Name("lonely")
	b.env.TrackExchange(lonely)
	if err := b.ch.ExchangeDeclare(lonely, "topic", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	m := publisher.Message{Type: "orders.created", Version: "1", Body: []byte(orderV1)}
	ctx := context.Background()
	err := b.pub.Publish(ctx, lonely, "order.created", m)
	if !errors.Is(err, publisher.ErrUnroutable) {
		t.Fatalf("want ErrUnroutable, got %v", err)
	}
	// A routing key nobody bound is the same failure.
	if err := b.pub.Publish(ctx, b.ex, "order.unheard-of", m); !errors.Is(err, publisher.ErrUnroutable) {
		t.Fatalf("want ErrUnroutable, got %v", err)
	}
	// The publisher still works afterwards.
	if err := b.pub.Publish(ctx, b.ex, "order.created", m); err != nil {
		t.Fatal(err)
	}
}

// A full queue with x-overflow=reject-publish nacks the message, and the
// caller can tell that apart with publisher.ErrNacked.
func TestPublishNacked(t *testing.T) {
	t.Parallel()
	b := setup(t, schemas.Identity{})
	full := b.env.Name("full")
	b.env.TrackQueue(full)
	args := amqp.Table{"x-max-length": int64(1), "x-overflow": "reject-publish"}
	if _, err := b.ch.QueueDeclare(full, false, false, false, false, args); err != nil {
		t.Fatal(err)
	}
	if err := b.ch.QueueBind(full, "order.full", b.ex, false, nil); err != nil {
		t.Fatal(err)
	}
	m := publisher.Message{Type: "orders.created", Version: "1", Body: []byte(orderV1)}
	ctx := context.Background()
	if err := b.pub.Publish(ctx, b.ex, "order.full", m); err != nil {
		t.Fatalf("first message into an empty queue: %v", err)
	}
	if err := b.pub.Publish(ctx, b.ex, "order.full", m); !errors.Is(err, publisher.ErrNacked) {
		t.Fatalf("want ErrNacked from a full queue, got %v", err)
	}
	// A nack leaves the channel usable.
	if err := b.pub.Publish(ctx, b.ex, "order.created", m); err != nil {
		t.Fatal(err)
	}
}

func TestPublishReopensAfterClosedChannel(t *testing.T) {
	t.Parallel()
	b := setup(t, schemas.Identity{})
	m := publisher.Message{Type: "orders.created", Version: "1", Body: []byte(orderV1)}
	ctx := context.Background()
	// Publishing to a missing exchange makes the broker close the channel.
	if err := b.pub.Publish(ctx, b.env.Name("missing"), "x", m); err == nil {
		t.Fatal("publish to a missing exchange succeeded")
	}
	if err := b.pub.Publish(ctx, b.ex, "order.created", m); err != nil {
		t.Fatalf("publish after a closed channel: %v", err)
	}
	_ = b.pub.Close()
	if err := b.pub.Publish(ctx, b.ex, "order.created", m); !errors.Is(err, publisher.ErrClosed) {
		t.Fatalf("publish after Close: %v", err)
	}
}

func TestPublishConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t, schemas.Identity{})
	ctx := context.Background()
	const n = 40
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- b.pub.Publish(ctx, b.ex, "order.created", publisher.Message{Type: "orders.created", Version: "1", Body: []byte(orderV1)})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if d := b.depth(t); d != n {
		t.Errorf("queue depth %d, want %d", d, n)
	}
}

// During a resource alarm the broker reads nothing from a connection that
// publishes: no confirm, no channel open, no close-ok comes until the alarm
// clears. Publish must end with its context, Close within its bound, and
// the connection must work again once the alarm clears.
func TestPublishAndCloseAreBoundedDuringAResourceAlarm(t *testing.T) {
	if testing.Short() {
		t.Skip("resource alarm on a private broker node: skipped in -short")
	}
	node := brokertest.StartPrivateNode(t)
	env := node.Env(t)
	reg, err := schemas.Load(schemas.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ch := env.Channel("setup")
	ex, queue := env.Name("orders"), env.Name("orders")
	if err := ch.ExchangeDeclare(ex, "topic", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, "order.created", ex, false, nil); err != nil {
		t.Fatal(err)
	}
	conn := env.Dial("publisher")
	blocked := make(chan bool, 4)
	amqpx.WatchBlocked(conn, func(b amqp.Blocking) { blocked <- b.Active })
	cfg := publisher.Config{Registry: reg}
	busy, err := publisher.New(conn, cfg) // publishes during the alarm
	if err != nil {
		t.Fatal(err)
	}
	idle, err := publisher.New(conn, cfg) // only has an open channel
	if err != nil {
		t.Fatal(err)
	}
	// Registered after the connections: runs before they are closed, which
	// would wait for the alarm too.
	alarmOn := false
	t.Cleanup(func() {
		if alarmOn {
			node.ClearMemoryAlarm()
		}
	})
	// bounded runs f and fails the test if it takes longer than limit. A
	// call that hangs is left behind; clearing the alarm ends it.
	bounded := func(what string, limit time.Duration, f func() error) error {
		t.Helper()
		start := time.Now()
		errc := make(chan error, 1)
		go func() { errc <- f() }()
		select {
		case err := <-errc:
			t.Logf("%s returned after %s: %v", what, time.Since(start).Round(time.Millisecond), err)
			return err
		case <-time.After(limit):
			t.Errorf("%s did not return within %s", what, limit)
			return nil
		}
	}
	m := publisher.Message{Type: "orders.created", Version: "1", Body: []byte(orderV1)}
	publish := func(p *publisher.Publisher, within time.Duration) func() error {
		return func() error {
			ctx, cancel := context.WithTimeout(context.Background(), within)
			defer cancel()
			return p.Publish(ctx, ex, "order.created", m)
		}
	}

	node.RaiseMemoryAlarm()
	alarmOn = true
	// The first publish is read (and makes the broker block the
	// connection); whether its confirm comes before the alarm clears
	// depends on the broker.
	bounded("first publish during the alarm", 4*time.Second, publish(busy, 2*time.Second))
	select {
	case active := <-blocked:
		if !active {
			t.Fatal("connection unblocked, want blocked")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the broker did not block the publishing connection")
	}
	// The first publish's channel was retired if its confirm did not come:
	// this one opens a new channel, which the broker doesn't answer either.
	if err := bounded("a second publish on the blocked connection", 3*time.Second, publish(busy, time.Second)); err == nil {
		t.Error("a publish on a blocked connection was confirmed")
	}
	if err := bounded("Close of an idle publisher", amqpx.CloseTimeout+2*time.Second, idle.Close); !errors.Is(err, amqpx.ErrCloseAbandoned) {
		t.Errorf("Close of an idle publisher on a blocked connection: %v, want ErrCloseAbandoned", err)
	}
	bounded("Close of the busy publisher", amqpx.CloseTimeout+2*time.Second, busy.Close)

	node.ClearMemoryAlarm()
	alarmOn = false
	after, err := publisher.New(conn, cfg)
	if err != nil {
		t.Fatalf("open a publisher after the alarm: %v", err)
	}
	defer after.Close()
	if err := publish(after, 30*time.Second)(); err != nil {
		t.Fatalf("publish after the alarm cleared: %v", err)
	}
}
