package quarantine

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Reading a stream over AMQP 0-9-1 consumes nothing: a consumer names where
// to start (x-stream-offset), needs a prefetch, and its acks only return
// credit. A stream has no end marker and reports no message count to a
// declare, so a read first finds the stream's last offset (a consumer at
// "last" gets the last chunk; its highest offset is a message that exists)
// and then reads from "first" up to that offset: a snapshot. Records
// written after the read began are left for the next read.

const (
	streamPrefetch = 5000
	// emptyWait is how long a consumer at "last" may stay silent before the
	// stream is taken to be empty. The broker delivers a stream's last chunk
	// at once; the margin is for a loaded machine.
	emptyWait = 1500 * time.Millisecond
	// chunkIdle ends the read of the last chunk.
	chunkIdle = 50 * time.Millisecond
)

var consumerSeq atomic.Int64

func consumerTag(purpose string) string {
	return fmt.Sprintf("dlxbridge-%s-%d-%d", purpose, time.Now().UnixNano(), consumerSeq.Add(1))
}

// readStream calls fn for each message of the stream, in offset order, up to
// the last one present when it was called.
func readStream(ctx context.Context, conn *amqp.Connection, name string, fn func(offset int64, d *amqp.Delivery) error) error {
	end, found, err := lastOffset(ctx, conn, name)
	if err != nil || !found {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("read %s: open channel: %w", name, err)
	}
	defer ch.Close()
	if err := ch.Qos(streamPrefetch, 0, false); err != nil {
		return fmt.Errorf("read %s: prefetch: %w", name, err)
	}
	tag := consumerTag("read")
	deliveries, err := ch.Consume(name, tag, false, false, false, false, amqp.Table{"x-stream-offset": "first"})
	if err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	defer func() { _ = ch.Cancel(tag, false) }()
	n := 0
	for {
		var d amqp.Delivery
		var ok bool
		select {
		case <-ctx.Done():
			return ctx.Err()
		case d, ok = <-deliveries:
		}
		if !ok {
			return fmt.Errorf("read %s: channel closed", name)
		}
		off := streamOffset(&d)
		if n++; n%100 == 0 {
			if err := d.Ack(true); err != nil {
				return fmt.Errorf("read %s: %w", name, err)
			}
		}
		if err := fn(off, &d); err != nil {
			return err
		}
		if off >= end {
			return nil
		}
	}
}

// lastOffset finds an offset at the end of the stream; found is false for
// an empty stream.
func lastOffset(ctx context.Context, conn *amqp.Connection, name string) (end int64, found bool, err error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, false, fmt.Errorf("read %s: open channel: %w", name, err)
	}
	defer ch.Close()
	if err := ch.Qos(streamPrefetch, 0, false); err != nil {
		return 0, false, fmt.Errorf("read %s: prefetch: %w", name, err)
	}
	tag := consumerTag("last")
	deliveries, err := ch.Consume(name, tag, false, false, false, false, amqp.Table{"x-stream-offset": "last"})
	if err != nil {
		return 0, false, fmt.Errorf("read %s (is it a stream? was the topology applied?): %w", name, err)
	}
	defer func() { _ = ch.Cancel(tag, false) }()
	wait := time.NewTimer(emptyWait)
	defer wait.Stop()
	end = -1
	for {
		select {
		case <-ctx.Done():
			return 0, false, ctx.Err()
		case <-wait.C:
			return end, end >= 0, nil
		case d, ok := <-deliveries:
			if !ok {
				return 0, false, fmt.Errorf("read %s: channel closed", name)
			}
			end = max(end, streamOffset(&d))
			wait.Reset(chunkIdle)
		}
	}
}

func streamOffset(d *amqp.Delivery) int64 {
	switch v := d.Headers["x-stream-offset"].(type) {
	case int64:
		return v
	case int32:
		return int64(v)
	}
	return -1
}
