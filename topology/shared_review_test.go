package topology_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/wire"
)

// A work queue with a length limit that is full (its consumer paused by
// an open breaker, say) refuses the retries dead-lettered back to it, and
// at-least-once dead-lettering holds each in its retry queue and tries it
// again. In a shared tier, past a few dozen of them (the dead-letter
// worker's prefetch) that held back every other queue's retries in the
// tier until the full queue drained: seen on 3.10.8 and 4.3.6 with both
// queues on one 300 ms tier, 100 refused retries, the other queue's retry
// not back after 20 s (with 10, back at once). So config refuses
// max_length on the shared tiers, and such a queue retries through its
// own lanes: there its refused retries hold back only its own, and the
// other queue's retries through the shared tier come back.
func TestAFullWorkQueueDoesNotHoldBackAnotherQueuesRetries(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	conn := env.Dial("topology")
	jitter := 0.0
	cfg := &config.Config{SharedTiers: config.SharedTiers{Prefix: env.Prefix}}
	for _, s := range []string{"full", "other"} {
		q := config.Queue{
			Name: env.Name(s), Exchange: config.Exchange{Name: env.Name("ex"), Type: "direct"}, Bindings: []string{s},
			Retry:   config.Retry{Tiers: []time.Duration{300 * time.Millisecond}, Jitter: &jitter, Lanes: 1, TierQueues: config.TierQueuesShared},
			Accepts: []config.Accept{{Type: "test.event", Versions: []string{"1"}}},
		}
		if s == "full" {
			q.MaxLength = 1
			q.Retry.TierQueues = config.TierQueuesPerQueue
		}
		cfg.Queues = append(cfg.Queues, q)
	}
	if err := cfg.Complete(); err != nil {
		t.Fatal(err)
	}
	topo, err := topology.BuildFor(cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (&topology.Broker{Conn: conn}).Apply(context.Background(), topo); err != nil {
		t.Fatal(err)
	}
	full, other := topo.Work[0], topo.Work[1]
	lane, shared := full.Tiers[0].Lanes[0], other.Tiers[0].Lanes[0]
	if full.Shared() || !other.Shared() {
		t.Fatalf("full retries through %s, other through %s: want its own lanes and the shared tiers", full.RetryExchange, other.RetryExchange)
	}
	ch := env.Channel("publish")
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 256))
	publish := func(exchange, key string, p amqp.Publishing) bool {
		t.Helper()
		if err := ch.PublishWithContext(context.Background(), exchange, key, false, false, p); err != nil {
			t.Fatal(err)
		}
		select {
		case c := <-confirms:
			return c.Ack
		case <-time.After(10 * time.Second):
			t.Fatal("no confirm")
		}
		return false
	}
	if !publish("", full.Name, amqp.Publishing{Body: []byte("fills it")}) {
		t.Fatal("the first message was refused")
	}
	// Retries of the full queue, as the runtime publishes them to its own
	// lane.
	const n = 100
	for range n {
		if !publish(full.RetryExchange, lane.RoutingKey, amqp.Publishing{Body: []byte("retry of full"), DeliveryMode: amqp.Persistent}) {
			t.Fatal("a retry into the lane was refused")
		}
	}
	// Give them time to expire and be refused by the full queue before the
	// other queue's retry is published (the lane's TTL is 300 ms; nothing
	// else signals it).
	time.Sleep(2 * time.Second)
	if !publish(other.RetryExchange, shared.RoutingKey, amqp.Publishing{Body: []byte("retry of other"), DeliveryMode: amqp.Persistent,
		Headers: amqp.Table{wire.HeaderCC: []any{other.Name}}}) {
		t.Fatal("the other retry was refused")
	}
	sent := time.Now()
	cons := env.Channel("consume")
	deliveries, err := cons.Consume(other.Name, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-deliveries:
		t.Logf("the other queue's retry came back after %s (tier TTL %s)", time.Since(sent), shared.MaxDelay)
		if string(d.Body) != "retry of other" {
			t.Fatalf("got %q", d.Body)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the other queue's retry did not come back within 20 s: it waits behind the full queue's %d refused retries", n)
	}
}
