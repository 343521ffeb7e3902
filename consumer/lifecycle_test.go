package consumer

import (
	"context"
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
