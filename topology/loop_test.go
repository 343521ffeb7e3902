package topology_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/topology"
)

// bundle is one integration test's broker, topology and work queue.
type bundle struct {
	env  *brokertest.Env
	topo *topology.Topology
	work *topology.WorkQueue
	pub  *amqpx.Publisher
}

// setup applies a short-tier topology with prefixed names on the real
// broker.
func setup(t *testing.T, deliveryLimit int) *bundle {
	t.Helper()
	env := brokertest.Require(t)
	conn := env.Dial("topology")
	topo, err := topology.BuildFor(shortConfig(t, env.Prefix, deliveryLimit), conn)
	if err != nil {
		t.Fatal(err)
	}
	in := &topology.Broker{Conn: conn}
	if _, err := in.Apply(context.Background(), topo); err != nil {
		t.Fatalf("apply: %v", err)
	}
	pub, err := amqpx.NewPublisher(env.Dial("publisher"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	w := &topo.Work[0]
	return &bundle{env: env, topo: topo, work: w, pub: pub}
}

func (b *bundle) publish(t *testing.T, exchange, key string, msg amqp.Publishing) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.pub.Publish(ctx, exchange, key, msg); err != nil {
		t.Fatalf("publish to %q/%q: %v", exchange, key, err)
	}
}

// consume starts a manual-ack consumer on its own named connection.
func (b *bundle) consume(t *testing.T, queue string) (*amqp.Channel, <-chan amqp.Delivery) {
	t.Helper()
	ch := b.env.Channel("consume-" + queue)
	if err := ch.Qos(10, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume %s: %v", queue, err)
	}
	return ch, ds
}

func receive(t *testing.T, ds <-chan amqp.Delivery, within time.Duration, what string) amqp.Delivery {
	t.Helper()
	select {
	case d, ok := <-ds:
		if !ok {
			t.Fatalf("%s: consumer closed", what)
		}
		return d
	case <-time.After(within):
		t.Fatalf("%s: nothing within %s", what, within)
		return amqp.Delivery{}
	}
}

// death finds the x-death entry for {queue, reason}, never by position.
func death(d amqp.Delivery, queue, reason string) (amqp.Table, bool) {
	entries, _ := d.Headers["x-death"].([]any)
	for _, e := range entries {
		tb, ok := e.(amqp.Table)
		if ok && tb["queue"] == queue && tb["reason"] == reason {
			return tb, true
		}
	}
	return nil, false
}

func TestRetryLaneReturnsOnlyToItsOwnWorkQueue(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	// Another consumer's queue bound to the same exchange with the same key.
	other := b.env.Name("other")
	setupCh := b.env.Channel("other")
	if _, err := setupCh.QueueDeclare(other, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := setupCh.QueueBind(other, "k", b.work.Exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	_, work := b.consume(t, b.work.Name)
	_, others := b.consume(t, other)

	// Sanity: an ordinary publish reaches both queues.
	b.publish(t, b.work.Exchange, "k", amqp.Publishing{Body: []byte("fanout")})
	for name, ds := range map[string]<-chan amqp.Delivery{"work": work, "other": others} {
		d := receive(t, ds, 5*time.Second, "ordinary publish to "+name)
		_ = d.Ack(false)
	}

	lane := b.work.Tiers[1].Lanes[0]
	start := time.Now()
	b.publish(t, b.work.RetryExchange, lane.RoutingKey, amqp.Publishing{Body: []byte("retry me"), MessageId: "m1"})
	d := receive(t, work, lane.MaxDelay+10*time.Second, "retry back in the work queue")
	elapsed := time.Since(start)
	_ = d.Ack(false)
	if d.MessageId != "m1" {
		t.Fatalf("got message %q", d.MessageId)
	}
	if elapsed < lane.MinDelay {
		t.Errorf("came back after %s, before the lane's delay %s", elapsed, lane.MinDelay)
	}
	if _, ok := death(d, lane.Queue, "expired"); !ok {
		t.Errorf("no x-death {%s, expired}: %v", lane.Queue, d.Headers["x-death"])
	}
	t.Logf("retry through %s (TTL %s) came back after %s", lane.Queue, lane.MaxDelay, elapsed)

	// The other queue must not get it. It would have arrived at the same
	// moment as the work queue's copy; give it generous time anyway.
	select {
	case d := <-others:
		t.Fatalf("retry leaked to the other queue bound to %s: %q", b.work.Exchange, d.Body)
	case <-time.After(time.Second):
	}
}

func TestDeliveryLimitEndsInQuarantine(t *testing.T) {
	t.Parallel()
	const limit = 2
	b := setup(t, limit)
	_, work := b.consume(t, b.work.Name)
	_, quarantine := b.consume(t, b.work.Quarantine)

	b.publish(t, b.work.Exchange, "k", amqp.Publishing{Body: []byte("poison"), MessageId: "p1"})
	deliveries := 0
	deadline := time.After(30 * time.Second)
	for {
		select {
		case d := <-work:
			deliveries++
			// reject (not nack): from 4.3 only reject(requeue) counts.
			if err := d.Reject(true); err != nil {
				t.Fatal(err)
			}
			continue
		case q := <-quarantine:
			_ = q.Ack(false)
			if q.MessageId != "p1" {
				t.Fatalf("quarantine got %q", q.MessageId)
			}
			if _, ok := death(q, b.work.Name, "delivery_limit"); !ok {
				t.Fatalf("no x-death {%s, delivery_limit}: %v", b.work.Name, q.Headers["x-death"])
			}
			// 3.x: limit N allows N+1 deliveries.
			if deliveries < limit || deliveries > limit+1 {
				t.Errorf("%d deliveries before dead-lettering, want %d or %d", deliveries, limit, limit+1)
			}
			t.Logf("dead-lettered to %s after %d deliveries (limit %d)", b.work.Quarantine, deliveries, limit)
			return
		case <-deadline:
			t.Fatalf("message never reached the quarantine (%d deliveries so far)", deliveries)
		}
	}
}

func TestExpiredInWorkQueueEndsInQuarantine(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	_, quarantine := b.consume(t, b.work.Quarantine)
	// No consumer on the work queue: the message expires at its head.
	b.publish(t, b.work.Exchange, "k", amqp.Publishing{Body: []byte("stale"), MessageId: "e1", Expiration: "50"})
	q := receive(t, quarantine, 30*time.Second, "expired message in the quarantine")
	_ = q.Ack(false)
	if _, ok := death(q, b.work.Name, "expired"); !ok {
		t.Fatalf("no x-death {%s, expired}: %v", b.work.Name, q.Headers["x-death"])
	}
}
