package consumer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// publishRewritten publishes p (as publish does) on a connection that
// applies pairs to the bytes on the wire.
func (b *testBundle) publishRewritten(p amqp.Publishing, pairs ...[2][]byte) {
	b.t.Helper()
	conn, err := amqp.DialConfig(b.env.URL, amqp.Config{Dial: brokertest.RewritingDial(pairs...)})
	if err != nil {
		b.t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.t.Fatal(err)
	}
	must(b.t, ch.Confirm(false))
	p.ContentType, p.Type = "application/json", testType
	p.Headers["schema-version"] = "1"
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), b.queue.Exchange.Name, "job.test", true, false, p)
	if err != nil {
		b.t.Fatal(err)
	}
	if ok, err := dc.WaitContext(context.Background()); err != nil || !ok {
		b.t.Fatalf("rewritten publish: ack %v, err %v", ok, err)
	}
}

// RabbitMQ accepts and delivers the AMQP field types 'u' (unsigned short)
// and 'i' (unsigned int), which amqp091-go cannot read: one such header, at
// any depth, made the client close the consuming connection with a syntax
// error on every delivery of the message, requeueing everything in flight
// (and raising every count) each time. The message and those queued behind
// it must reach their handler on their first delivery, the value intact.
func TestUnsignedHeaderFieldTypesNeitherCloseTheConnectionNorSkipTheHandler(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) {
		q.Consumer.Concurrency = 1
		q.Consumer.Prefetch = 10
	})
	lost := make(chan error, 16)
	b.cfg.hooks.reconnecting = func(err error) { lost <- err }

	// int16(-1) and int32(-2) go out as 's' and 'I'; the rewrite makes them
	// 'u' 65535 and 'i' 4294967294, at the top, in a table and in an array.
	b.publishRewritten(amqp.Publishing{MessageId: "unsigned", Body: []byte(`{"id": "unsigned"}`), Headers: amqp.Table{
		"top-u16": int16(-1),
		"top-u32": int32(-2),
		"nested":  amqp.Table{"in-u32": int32(-2)},
		"arr-u16": []any{int16(-1)},
	}},
		[2][]byte{[]byte("top-u16s"), []byte("top-u16u")},
		[2][]byte{[]byte("top-u32I"), []byte("top-u32i")},
		[2][]byte{[]byte("in-u32I"), []byte("in-u32i")},
		[2][]byte{[]byte("arr-u16A\x00\x00\x00\x03s"), []byte("arr-u16A\x00\x00\x00\x03u")},
	)
	for i := range 5 {
		id := fmt.Sprintf("behind-%d", i)
		b.publishJSON(map[string]any{"id": id}, amqp.Publishing{MessageId: id})
	}

	var mu sync.Mutex
	seen := map[string]*Message{}
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			mu.Lock()
			defer mu.Unlock()
			if seen[m.MessageID] != nil {
				return fmt.Errorf("%s handled twice", m.MessageID)
			}
			seen[m.MessageID] = m
			return nil
		})))
	})
	for acked := 0; acked < 6; {
		select {
		case o := <-b.settled:
			if o != OutcomeAcked {
				t.Fatalf("outcome %q after %d acks", o, acked)
			}
			acked++
		case err := <-lost:
			t.Fatalf("the runtime lost a connection after %d acks: %v", acked, err)
		case <-time.After(20 * time.Second):
			t.Fatalf("only %d of 6 messages acked within 20s", acked)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for id, m := range seen {
		if n, _ := m.Headers["x-delivery-count"].(int64); n != 0 || m.Attempt != 1 {
			t.Errorf("%s: handled on delivery %d, attempt %d; want the first", id, n+1, m.Attempt)
		}
	}
	h := seen["unsigned"].Headers
	want := map[string]any{
		"top-u16": int32(65535),
		"top-u32": int64(4294967294),
		"nested":  amqp.Table{"in-u32": int64(4294967294)},
		"arr-u16": []any{int32(65535)},
	}
	for k, v := range want {
		if fmt.Sprintf("%#v", h[k]) != fmt.Sprintf("%#v", v) {
			t.Errorf("header %s = %#v, want %#v", k, h[k], v)
		}
	}
}

// A message an upstream queue dead-lettered into the work queue is
// re-admitted on RabbitMQ 4.x (see triage.Precheck). The copy keeps every
// producer header, so a producer header that leaves no room for the bridge's
// re-admission headers made the copy not fit one frame, and the original
// was rejected into the quarantine without its handler ever running (on
// 3.10 the same message is handled). It must reach its handler.
func TestMessageWhoseReadmissionCannotFitStillReachesItsHandler(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) {
		q.DeliveryLimit = 2
		q.Consumer.CrashLoopDeliveries = 1
	})
	b.cfg.hooks.frameMax = 4096
	rec := newRecorder()
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			rec.record(m)
			return nil
		})))
	})
	// Fits the upstream publish, the broker's dead-lettering and the
	// delivery; not with the re-admission's headers on top.
	b.upstreamRejectWith("big-up", 1, amqp.Table{"x-app-blob": strings.Repeat("b", 3500)})
	outcomes := b.settledPastReadmission()
	t.Logf("broker %s: outcomes %v", b.env.ServerVersion, outcomes)
	if n := rec.count(); n != 1 || outcomes[len(outcomes)-1] != OutcomeAcked {
		t.Fatalf("handler ran %d times, outcomes %v; want it to run once and ack", n, outcomes)
	}
}
