package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
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

// A panicking upcaster is a classified failure like a panicking handler,
// never a crashed process.
func TestPanickingUpcasterEndsInQuarantine(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var calls atomic.Int32
	b.start(func(c *Consumer) {
		must(t, c.HandleVersion(b.queue.Name, testType, "2", HandlerFunc(func(ctx context.Context, m *Message) error {
			calls.Add(1)
			return nil
		})))
		must(t, c.Upcast(testType, "1", "2", func(data any) (any, error) {
			var m map[string]any
			m["upcast"] = true // nil map write: a real panic
			return m, nil
		}))
	})
	b.publishJSON(map[string]any{"id": "old"}, amqp.Publishing{MessageId: "old", Headers: amqp.Table{"schema-version": "1"}})
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	env, _ := quarantine.Read(ptr(b.quarantined()))
	if env.Class != triage.ClassPanic || calls.Load() != 0 {
		t.Fatalf("class %q, handler calls %d; want panic and 0", env.Class, calls.Load())
	}
}

// Abandoned handlers keep their concurrency slot until they return: with
// every slot held by a handler that ignores its deadline, no further handler
// starts until one of them returns.
func TestAbandonedHandlersBoundConcurrency(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) {
		q.Consumer.HandlerTimeout = 100 * time.Millisecond
		q.Consumer.Concurrency = 2
		q.Retry.MaxAttempts = 1 // a timeout goes straight to quarantine
	})
	release := make(chan struct{})
	var running, maxRunning atomic.Int32
	started := make(chan string, 16)
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			n := running.Add(1)
			defer running.Add(-1)
			for {
				old := maxRunning.Load()
				if n <= old || maxRunning.CompareAndSwap(old, n) {
					break
				}
			}
			started <- m.MessageID
			<-release // ignores ctx
			return nil
		})))
	})
	for _, id := range []string{"a", "b", "c"} {
		b.publishJSON(map[string]any{"id": id}, amqp.Publishing{MessageId: id})
	}
	<-started
	<-started
	b.waitOutcome(OutcomeQuarantined, 10*time.Second) // both abandoned as timeouts
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	select {
	case id := <-started:
		t.Fatalf("handler for %s started while both slots were held by abandoned handlers", id)
	case <-time.After(500 * time.Millisecond): // a negative check: nothing may start
	}
	close(release)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the third handler never started after the slots were freed")
	}
	b.waitOutcome(OutcomeAcked, 10*time.Second)
	if m := maxRunning.Load(); m > 2 {
		t.Fatalf("%d handlers ran at once, want at most 2", m)
	}
}

// Retries and quarantines publish on their own connection; losing it ends
// the session (after a drain) and the runtime comes back with both.
func TestLosingThePublishingConnectionRecovers(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.env.RequireManagement()
	reconnected := make(chan error, 4)
	b.cfg.hooks.reconnecting = func(err error) { reconnected <- err }
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			if m.Attempt == 1 {
				return errors.New("retry me")
			}
			return nil
		})))
	})
	if n := b.env.CloseConnections(b.cfg.ConnectionName + "/publish"); n != 1 {
		t.Fatalf("closed %d publishing connections, want 1", n)
	}
	select {
	case err := <-reconnected:
		if !strings.Contains(err.Error(), "publishing connection") {
			t.Fatalf("cause %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("losing the publishing connection went unnoticed")
	}
	b.waitConsuming()
	b.publishJSON(map[string]any{"id": "p"}, amqp.Publishing{MessageId: "p"})
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	b.waitOutcome(OutcomeAcked, 10*time.Second)
}

// A graceful stop cancels the subscription and handles what was already
// delivered (prefetched, not yet started) instead of leaving it to the
// channel close, which would return it with a raised x-delivery-count:
// after a few deploys innocent messages would look like crash loops.
func TestGracefulStopHandlesPrefetchedDeliveries(t *testing.T) {
	t.Parallel()
	const total = 40
	b := setup(t, func(q *config.Queue) {
		q.Consumer.Prefetch = 10
		q.Consumer.Concurrency = 2
		q.DeliveryLimit = 10
		q.Consumer.CrashLoopDeliveries = 5 // a raised count must show up below, not be quarantined
	})
	b.cfg.DrainTimeout = 15 * time.Second
	stopping := make(chan struct{}, 1)
	b.cfg.hooks.stopping = func(string) { stopping <- struct{}{} }

	type seen struct {
		run   int
		count any // x-delivery-count as the handler saw it
	}
	var mu sync.Mutex
	handled := map[string][]seen{}
	run := 1
	entered := make(chan struct{}, total)
	release := make(chan struct{})
	register := func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			mu.Lock()
			handled[m.MessageID] = append(handled[m.MessageID], seen{run: run, count: m.Headers["x-delivery-count"]})
			r := run
			mu.Unlock()
			if r == 1 {
				entered <- struct{}{}
				<-release // both workers busy: the rest of the prefetch waits, unstarted
			}
			return nil
		})))
	}
	for i := range total {
		id := fmt.Sprintf("g-%02d", i)
		b.publishJSON(map[string]any{"id": id}, amqp.Publishing{MessageId: id})
	}
	stop := b.start(register)
	<-entered
	<-entered
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	<-stopping // the consumer is being cancelled while deliveries wait in the prefetch
	close(release)
	<-stopped

	mu.Lock()
	first := len(handled)
	mu.Unlock()
	if first >= total {
		t.Fatalf("the first run handled all %d messages; the stop came too late to test anything", total)
	}
	mu.Lock()
	run = 2
	mu.Unlock()
	b.cfg.Registerer = prometheus.NewRegistry()
	b.start(register)
	deadline := time.After(30 * time.Second)
	for {
		mu.Lock()
		n := len(handled)
		mu.Unlock()
		if n == total {
			break
		}
		select {
		case <-b.settled:
		case <-deadline:
			t.Fatalf("%d of %d messages handled after the restart", n, total)
		}
	}

	mu.Lock()
	defer mu.Unlock()
	var raised, twice []string
	for id, ss := range handled {
		if len(ss) > 1 {
			twice = append(twice, id)
		}
		for _, s := range ss {
			if s.run == 2 && s.count != nil && s.count != int64(0) {
				raised = append(raised, fmt.Sprintf("%s (x-delivery-count %v)", id, s.count))
			}
		}
	}
	t.Logf("first run handled %d of %d before the stop completed", first, total)
	if len(raised) > 0 {
		t.Errorf("the graceful stop raised the delivery count of %d messages: %v", len(raised), raised)
	}
	if len(twice) > 0 {
		t.Errorf("%d messages were handled twice: %v", len(twice), twice)
	}
}
