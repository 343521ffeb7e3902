package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
)

// A URL list whose first node is down: the runtime connects to the second,
// consumes, and says which node it is on (the log line on connect, Node).
func TestConsumesFromTheNextNodeWhenTheFirstIsDown(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var logs syncBuffer
	b.cfg.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	b.cfg.URL = "amqp://guest:guest@127.0.0.1:1/," + b.env.URL
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error { return nil })))
	})
	b.publishJSON(map[string]any{"id": "j-1"}, amqp.Publishing{MessageId: "m-1"})
	b.waitOutcome(OutcomeAcked, 10*time.Second)

	ep, err := amqpx.ParseAMQPURL(b.env.URL)
	if err != nil {
		t.Fatal(err)
	}
	addr := amqpx.Node{Endpoint: ep}.Addr()
	if n := b.consumer.Node(); !strings.HasPrefix(n, addr+" (cluster ") {
		t.Errorf("Node() = %q, want %s and its cluster", n, addr)
	}
	connected := logs.records(t, "connected")
	if len(connected) != 2 { // the consuming and the publishing connection
		t.Fatalf("%d connect lines, want 2:\n%s", len(connected), logs.String())
	}
	for _, r := range connected {
		if r["node"] != addr || r["cluster"] == "" || r["cluster"] == nil || r["version"] != b.env.ServerVersion {
			t.Errorf("connect line %v, want node %s with its cluster and version %s", r, addr, b.env.ServerVersion)
		}
	}
	if skipped := logs.records(t, "node did not answer; trying the next"); len(skipped) != 1 || skipped[0]["node"] != "127.0.0.1:1" {
		t.Errorf("want one line about the dead node, got %v", skipped)
	}
	if strings.Contains(logs.String(), "guest:guest") {
		t.Errorf("the log shows a password:\n%s", logs.String())
	}
}

// The node the runtime is connected to goes down mid-stream (its socket
// closes, and it refuses new connections): the runtime reconnects to the
// next node of the list within its backoff, and every message is handled,
// those in flight at the cut redelivered, none lost.
func TestFailsOverWhenItsNodeGoesDown(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	first, second := b.env.Proxy(), b.env.Proxy()
	b.cfg.URL = first.URL + "," + second.URL
	var logs syncBuffer
	b.cfg.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	reconnecting := make(chan error, 16)
	b.cfg.hooks.reconnecting = func(err error) { reconnecting <- err }
	handled := make(chan string, 256)
	// Past the fifth call, handlers hold their message until the node is
	// down: those are in flight at the cut, unacked.
	var calls atomic.Int32
	held := make(chan struct{})
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			handled <- m.MessageID
			if calls.Add(1) > 5 {
				<-held
			}
			return nil
		})))
	})
	if n := b.consumer.Node(); !strings.HasPrefix(n, first.Addr+" ") {
		t.Fatalf("Node() = %q, want the first node %s", n, first.Addr)
	}
	const total = 40
	for i := range total {
		b.publishJSON(map[string]any{"id": fmt.Sprint(i)}, amqp.Publishing{MessageId: fmt.Sprintf("m-%d", i)})
	}
	seen := map[string]int{}
	wait := func(until func() bool) {
		t.Helper()
		deadline := time.After(20 * time.Second)
		for !until() {
			select {
			case id := <-handled:
				seen[id]++
			case <-deadline:
				t.Fatalf("handled %d of %d ids; log:\n%s", len(seen), total, logs.String())
			}
		}
	}
	wait(func() bool { return len(seen) >= 5+b.queue.Consumer.Concurrency })
	cut := time.Now()
	first.Down()
	close(held)
	select {
	case err := <-reconnecting:
		t.Logf("runtime noticed: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("the runtime did not notice its node going down")
	}
	b.waitConsuming()
	took := time.Since(cut)
	if n := b.consumer.Node(); !strings.HasPrefix(n, second.Addr+" ") {
		t.Errorf("after the failover Node() = %q, want the second node %s", n, second.Addr)
	}
	wait(func() bool { return len(seen) == total })
	dups := 0
	for _, n := range seen {
		dups += n - 1
	}
	t.Logf("failover to the second node took %s; %d ids, %d handled twice (in flight at the cut)", took.Round(time.Millisecond), len(seen), dups)
	if dups == 0 {
		t.Error("no message in flight at the cut came back: the cut was not mid-stream")
	}
	if got := testutil.ToFloat64(b.consumer.metrics.reconnects); got < 1 {
		t.Errorf("reconnects = %v, want >= 1", got)
	}
	var onSecond int
	for _, r := range logs.records(t, "connected") {
		if r["node"] == second.Addr {
			onSecond++
		}
	}
	if onSecond != 2 {
		t.Errorf("%d connections logged on the second node, want 2 (consuming, publishing):\n%s", onSecond, logs.String())
	}
	// The runtime went straight to the second node: the first, refusing,
	// was not tried before it (the round starts after the lost node).
	if skipped := logs.records(t, "node did not answer; trying the next"); len(skipped) != 0 {
		t.Errorf("tried the lost node first: %v", skipped)
	}
}
