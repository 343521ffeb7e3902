package consumer

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
)

// With more workers than half the prefetch, long handlers can hold most of
// it: the broker then delivers only as the one free worker's acks are
// written. Those acks wait behind the long handlers' tags; if the free
// worker left them there when it waited for its next delivery, it would
// wait for the window's timer (ackStale) every message.
func TestFreeWorkerIsNotPacedByTheAckTimerWhileHandlersHoldThePrefetch(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) {
		q.Consumer.Prefetch, q.Consumer.Concurrency = 4, 4
		q.Consumer.HandlerTimeout = time.Minute
	})
	release := make(chan struct{})
	started := make(chan struct{}, 3)
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			if strings.HasPrefix(m.IdempotencyKey, "long-") {
				started <- struct{}{}
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
			return nil
		})))
	})
	defer close(release)
	for _, id := range []string{"long-1", "long-2", "long-3"} {
		b.publishJSON(map[string]any{"id": id}, amqp.Publishing{MessageId: id})
	}
	for range 3 {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("the long handlers did not start")
		}
	}
	const n = 40
	begin := time.Now()
	for i := range n {
		b.publishJSON(map[string]any{"id": "quick"}, amqp.Publishing{MessageId: fmt.Sprint("quick-", i)})
	}
	for range n {
		b.waitOutcome(OutcomeAcked, 10*time.Second)
	}
	took := time.Since(begin)
	t.Logf("%d messages beside 3 long handlers (prefetch 4, concurrency 4) in %v", n, took)
	if limit := n * ackStale / 2; took > limit {
		t.Errorf("%d messages took %v beside the long handlers, over %v: paced by the ack timer (%v)", n, took, limit, ackStale)
	}
}
