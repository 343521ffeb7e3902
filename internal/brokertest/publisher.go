package brokertest

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
)

// Publisher publishes messages one at a time with confirm + mandatory and
// retries each on a fresh connection until the broker confirms it: through
// node restarts and forced closes a fault test's own publisher loses
// nothing either. Its counters may be read while it runs.
type Publisher struct {
	// URL and Name (the connection name) say where and as whom; Exchange
	// is where every message goes.
	URL, Name, Exchange string
	// Pace is the wait before each message; 0 publishes back to back.
	Pace time.Duration

	confirmed atomic.Int64
	retried   atomic.Int64
	resent    atomic.Int64
	unpaced   atomic.Bool
}

// Unpace makes PublishAll send the rest back to back: a test that needed
// the pace only while a fault lasted does not wait it out afterwards.
func (p *Publisher) Unpace() { p.unpaced.Store(true) }

// Confirmed is how many messages the broker confirmed.
func (p *Publisher) Confirmed() int { return int(p.confirmed.Load()) }

// Retried is how many failed attempts (dial, channel or publish) were
// retried.
func (p *Publisher) Retried() int { return int(p.retried.Load()) }

// Resent is how many messages were sent again after a send that was not
// confirmed: possible duplicates, since the broker may have the first copy.
func (p *Publisher) Resent() int { return int(p.resent.Load()) }

// PublishAll publishes messages 0..n-1, message(i) giving each one's
// routing key and content, until all are confirmed or ctx ends. A nack or
// a return keeps the connection; any other failure drops it, and the next
// attempt dials again after 100 ms (the node may be down: no spinning).
func (p *Publisher) PublishAll(ctx context.Context, n int, message func(i int) (key string, msg amqp.Publishing)) error {
	var conn *amqp.Connection
	var pub *amqpx.Publisher
	drop := func() {
		if pub != nil {
			_ = pub.Close()
		}
		if conn != nil {
			_ = conn.Close()
		}
		pub, conn = nil, nil
	}
	defer drop()
	for i := range n {
		if p.Pace > 0 && !p.unpaced.Load() {
			select {
			case <-time.After(p.Pace):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		key, msg := message(i)
		sent := false
		for attempt := 0; ; attempt++ {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if attempt > 0 {
				p.retried.Add(1)
				select {
				case <-time.After(100 * time.Millisecond):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			if pub == nil {
				var err error
				if conn, err = amqpx.Dial(p.URL, p.Name); err != nil {
					conn = nil
					continue
				}
				if pub, err = amqpx.NewPublisher(conn); err != nil {
					drop()
					continue
				}
			}
			if sent {
				p.resent.Add(1)
			}
			sent = true
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := pub.Publish(pctx, p.Exchange, key, msg)
			cancel()
			if err == nil {
				p.confirmed.Add(1)
				break
			}
			if !errors.Is(err, amqpx.ErrNacked) && !errors.Is(err, amqpx.ErrUnroutable) {
				drop()
			}
		}
	}
	return nil
}
