package consumer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
)

// 1,000 messages that fail at the same moment must come back spread over the
// jitter window, not as one herd. The test reports the spread.
func TestBurstOfFailuresReturnsSpreadOverTime(t *testing.T) {
	t.Parallel()
	const n = 1000
	const tier = time.Second
	jitter := 1.0
	b := setup(t, func(q *config.Queue) {
		q.Retry.Tiers = []time.Duration{tier}
		q.Retry.Jitter = &jitter
		q.Retry.Lanes = 8
		q.Consumer.Prefetch = 200
		q.Consumer.Concurrency = 8
	})
	var mu sync.Mutex
	failedAt := map[string]time.Time{}
	var delays []time.Duration
	var returns []time.Time
	done := make(chan struct{})
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			mu.Lock()
			defer mu.Unlock()
			if m.Attempt == 1 {
				failedAt[m.MessageID] = time.Now()
				return errors.New("dependency down for everyone")
			}
			now := time.Now()
			delays = append(delays, now.Sub(failedAt[m.MessageID]))
			returns = append(returns, now)
			if len(delays) == n {
				close(done)
			}
			return nil
		})))
	})
	b.publishBatch(n, b.queue.Exchange.Name, "job.burst")
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		mu.Lock()
		t.Fatalf("only %d of %d messages came back", len(delays), n)
	}
	mu.Lock()
	defer mu.Unlock()

	slices.Sort(delays)
	pct := func(p float64) time.Duration { return delays[int(p*float64(len(delays)-1))] }
	var sum, sq float64
	for _, d := range delays {
		sum += d.Seconds()
	}
	mean := sum / float64(len(delays))
	for _, d := range delays {
		sq += (d.Seconds() - mean) * (d.Seconds() - mean)
	}
	std := math.Sqrt(sq / float64(len(delays)))
	// Arrivals per 100 ms bucket, from the first return (reported, not
	// asserted: under -race a slow consumer queues returns up itself).
	slices.SortFunc(returns, func(a, b time.Time) int { return a.Compare(b) })
	buckets := map[int]int{}
	busiest := 0
	for _, r := range returns {
		k := int(r.Sub(returns[0]) / (100 * time.Millisecond))
		buckets[k]++
		busiest = max(busiest, buckets[k])
	}
	t.Logf("retry delay of %d messages (tier %s, jitter %.0f%%, %d lanes): min %s p10 %s p50 %s p90 %s max %s, stddev %.0fms",
		n, tier, jitter*100, b.queue.Retry.Lanes, pct(0), pct(0.1), pct(0.5), pct(0.9), pct(1), std*1000)
	t.Logf("returns spread over %s in %d buckets of 100ms; busiest bucket %d (%.0f%%)",
		returns[len(returns)-1].Sub(returns[0]), len(buckets), busiest, 100*float64(busiest)/n)

	window := time.Duration(float64(tier) * jitter)
	if pct(0) < tier-50*time.Millisecond {
		t.Errorf("a retry came back after %s, before its tier %s", pct(0), tier)
	}
	if spread := pct(0.9) - pct(0.1); spread < window/2 {
		t.Errorf("p10–p90 spread %s is under half the jitter window %s: the herd came back together", spread, window)
	}
}

// publishBatch publishes n valid messages to exchange with key, waiting for
// confirms every 500 messages (and at the end).
func (b *testBundle) publishBatch(n int, exchange, key string) {
	b.t.Helper()
	pending := 0
	waitConfirms := func() {
		for ; pending > 0; pending-- {
			select {
			case c := <-b.confirms:
				if !c.Ack {
					b.t.Fatalf("publish %d nacked", c.DeliveryTag)
				}
			case <-time.After(30 * time.Second):
				b.t.Fatalf("%d confirms missing", pending)
			}
		}
	}
	for i := 0; i < n; i++ {
		p := amqp.Publishing{
			ContentType: "application/json",
			Type:        testType,
			MessageId:   fmt.Sprintf("batch-%d", i),
			Headers:     amqp.Table{"schema-version": "1"},
			Body:        []byte(fmt.Sprintf(`{"id":"batch-%d","note":"a realistic-ish payload of a few dozen bytes"}`, i)),
		}
		if err := b.pubCh.PublishWithContext(context.Background(), exchange, key, true, false, p); err != nil {
			b.t.Fatalf("publish %d: %v", i, err)
		}
		if pending++; pending == 500 {
			waitConfirms()
		}
	}
	waitConfirms()
}
