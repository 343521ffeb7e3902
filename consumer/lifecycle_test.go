package consumer

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/config"
)

// After the broker drops the connection the runtime reconnects and resumes
// consuming on its own.
func TestReconnectsAfterConnectionLoss(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.env.RequireManagement() // to close a connection from the broker side
	reconnected := make(chan error, 4)
	b.cfg.hooks.reconnecting = func(err error) { reconnected <- err }
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error { return nil })))
	})
	b.publishJSON(map[string]any{"id": "before"}, amqp.Publishing{MessageId: "before"})
	b.waitOutcome(OutcomeAcked, 10*time.Second)

	if n := b.env.CloseConnections(b.cfg.ConnectionName); n != 1 {
		t.Fatalf("closed %d consumer connections, want 1", n)
	}
	select {
	case err := <-reconnected:
		t.Logf("runtime noticed: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("runtime did not notice the closed connection")
	}
	b.waitConsuming()
	b.publishJSON(map[string]any{"id": "after"}, amqp.Publishing{MessageId: "after"})
	b.waitOutcome(OutcomeAcked, 10*time.Second)
	if got := testutil.ToFloat64(b.consumer.metrics.reconnects); got != 1 {
		t.Fatalf("reconnects = %v, want 1", got)
	}
}

// Shutdown stops consuming but lets the handler in flight finish and ack.
func TestShutdownDrainsInFlightHandlers(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	entered := make(chan struct{})
	release := make(chan struct{})
	stop := b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			close(entered)
			<-release
			return nil
		})))
	})
	b.publishJSON(map[string]any{"id": "in-flight"}, amqp.Publishing{MessageId: "in-flight"})
	<-entered
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("Run returned while a handler was still running")
	case <-time.After(200 * time.Millisecond): // a negative check: Run must still be draining
	}
	close(release)
	b.waitOutcome(OutcomeAcked, 10*time.Second)
	<-stopped
	if d := b.queueDepth(b.queue.Name); d != 0 {
		t.Fatalf("work queue holds %d after drain, want 0", d)
	}
}

// A handler that ignores its deadline is abandoned after a grace period and
// the delivery is treated as a timeout: retried, not stuck.
func TestHangingHandlerTimesOutAndIsRetried(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) { q.Consumer.HandlerTimeout = 200 * time.Millisecond })
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			if m.Attempt == 1 {
				<-hang // ignores ctx
			}
			return nil
		})))
	})
	b.publishJSON(map[string]any{"id": "hang"}, amqp.Publishing{MessageId: "hang"})
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	b.waitOutcome(OutcomeAcked, 10*time.Second)
	if got := testutil.ToFloat64(b.consumer.metrics.abandonedHandler); got != 1 {
		t.Fatalf("abandoned handlers = %v, want 1", got)
	}
}

// A connection lost while a handler runs: nothing is acked on the dead
// channel, the runtime reconnects and the broker redelivers the message,
// which is then handled. Nothing lost; the duplicate is visible.
func TestConnectionLostMidHandlerRedeliversInsteadOfAcking(t *testing.T) {
	t.Parallel()
	// A long deadline: only the connection loss may end the first attempt
	// (the management API can take seconds to list the connection).
	b := setup(t, func(q *config.Queue) { q.Consumer.HandlerTimeout = time.Minute })
	b.env.RequireManagement()
	entered := make(chan struct{}, 4)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	var calls atomic.Int32
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			if calls.Add(1) == 1 {
				entered <- struct{}{}
				<-release // the first delivery is still in the handler when the connection dies
			}
			return nil
		})))
	})
	b.publishJSON(map[string]any{"id": "mid-flight"}, amqp.Publishing{MessageId: "mid-flight"})
	<-entered
	if n := b.env.CloseConnections(b.cfg.ConnectionName); n != 1 {
		t.Fatalf("closed %d connections, want 1", n)
	}
	b.waitOutcome(OutcomeAbandoned, 15*time.Second)
	b.waitConsuming()
	b.waitOutcome(OutcomeAcked, 15*time.Second)
	if n := calls.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2 (the original and the redelivery)", n)
	}
	if d := b.queueDepth(b.queue.Name); d != 0 {
		t.Fatalf("work queue holds %d, want 0", d)
	}
}

// When the broker cancels the consumer (here: its queue is deleted), the
// runtime notices, and resumes once the queue is back.
func TestBrokerCancelledConsumerIsRestarted(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	reconnected := make(chan error, 64)
	b.cfg.hooks.reconnecting = func(err error) { reconnected <- err }
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error { return nil })))
	})
	ch := b.env.Channel("admin")
	if _, err := ch.QueueDelete(b.queue.Name, false, false, false); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-reconnected:
		if !strings.Contains(err.Error(), "cancelled") {
			t.Fatalf("first reconnect cause: %v, want the broker's cancel", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the runtime did not notice its consumer was cancelled")
	}
	applyTopology(t, b.env.Dial("reapply"), b.topo)
	b.waitConsuming()
	b.publishJSON(map[string]any{"id": "after"}, amqp.Publishing{MessageId: "after"})
	b.waitOutcome(OutcomeAcked, 10*time.Second)
}
