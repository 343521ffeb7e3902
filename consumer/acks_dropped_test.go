package consumer

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// The window's premise, on a real channel: the client drops deliveries
// addressed to a consumer it has removed (here: cancelled without waiting,
// while the broker still sends it the prefetch), and the next consumer's
// deliveries on the channel skip their tags. The window requeues them once a
// later tag shows the gap; they come back on the new consumer and are acked
// like the rest. No write names a tag the broker no longer holds (that would
// close the channel), and every message is handled exactly once: nothing
// dropped is lost, nothing is acked unhandled.
func TestAckWindowRequeuesWhatTheClientDroppedOnARealChannel(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	q := env.Name("dropped")
	conn := env.Dial("dropped")
	pub, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := pub.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n, prefetch = 400, 100
	publish := func() {
		for i := range n {
			dc, err := pub.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, amqp.Publishing{Body: []byte(fmt.Sprint(i))})
			if err != nil {
				t.Fatal(err)
			}
			if i == n-1 {
				if ok, err := dc.WaitContext(ctx); !ok || err != nil {
					t.Fatalf("confirm: %v %v", ok, err)
				}
			}
		}
	}

	for round := 0; ; round++ {
		if round == 5 {
			t.Skip("the client dropped no delivery in 5 rounds: the race this test needs did not happen")
		}
		publish()
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		if err := ch.Qos(prefetch, 0, false); err != nil {
			t.Fatal(err)
		}
		w := newAckWindow(func(write func() error) error { return write() }, prefetch, 1)
		handled := map[string]int{}
		var dropped []uint64
		handle := func(d amqp.Delivery) {
			more, err := w.received(&d)
			if err != nil {
				t.Fatalf("requeue of dropped tags %v: %v", more, err)
			}
			dropped = append(dropped, more...)
			handled[string(d.Body)]++
			w.ack(&d, func(err error) {
				if err != nil {
					t.Errorf("ack %d: %v", d.DeliveryTag, err)
				}
			})
		}
		a, err := ch.ConsumeWithContext(ctx, q, "a", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Cancel("a", true); err != nil { // the client forgets "a" at once
			t.Fatal(err)
		}
		for d := range a {
			handle(d)
		}
		b, err := ch.ConsumeWithContext(ctx, q, "b", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		for len(handled) < n {
			select {
			case d := <-b:
				handle(d)
			case e := <-closed:
				t.Fatalf("the channel closed: %v (handled %d of %d, dropped %v)", e, len(handled), n, dropped)
			case <-ctx.Done():
				t.Fatalf("handled %d of %d (dropped and requeued: %v; a dropped tag after the last delivery is never seen)", len(handled), n, dropped)
			}
		}
		w.flush(true)
		if err := ch.Cancel("b", false); err != nil {
			t.Fatal(err)
		}
		for d := range b { // delivered before the cancel-ok: none should be left
			t.Errorf("delivery %d (%s) after every message was handled", d.DeliveryTag, d.Body)
		}
		for body, k := range handled {
			if k != 1 {
				t.Errorf("message %s handled %d times", body, k)
			}
		}
		if w.held() != 0 {
			t.Errorf("window holds %d entries", w.held())
		}
		// Every ack and reject was accepted: a synchronous call on the
		// channel would fail had the broker closed it over an unknown tag.
		if qi, err := ch.QueueDeclarePassive(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil || qi.Messages != 0 {
			t.Fatalf("queue holds %d ready messages (err %v)", qi.Messages, err)
		}
		if err := ch.Close(); err != nil {
			t.Fatal(err)
		}
		if len(dropped) > 0 {
			t.Logf("round %d: the client dropped tags %v; requeued and handled", round, dropped)
			return
		}
	}
}
