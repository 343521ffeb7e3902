package quarantine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Reading a stream over AMQP 0-9-1 consumes nothing: a consumer names where
// to start (x-stream-offset), needs a prefetch, and its acks only return
// credit. A stream has no end marker, and the message count a declare
// reports comes from the broker's periodic statistics (0 right after three
// confirmed publishes on both versions, 3 only seconds later), so a read
// first finds the stream's last offset (a consumer at "last" gets the last
// chunk; its highest offset is a message that exists) and then reads from
// "first" up to that offset: a snapshot. Records written after the read
// began are left for the next read. That end is found by waiting for the
// broker (streamWaits), which a loaded machine can outlast: good enough for
// looking, not for deciding. A replay or purge therefore writes a marker
// into the events stream under its lock and reads up to that marker
// instead (see Replayer.claim): every event confirmed before it is read,
// however slow the broker, and an empty stream is never waited on.

const streamPrefetch = 5000

// streamWaits are how long a reader waits to find a stream's end (see
// lastOffset). The zero value means the defaults.
type streamWaits struct {
	// empty is how long a consumer at "last" may stay silent before the
	// stream is taken to be empty. The broker delivers a stream's last
	// chunk at once; the margin is for a loaded machine. Defaults to 1.5s.
	empty time.Duration
	// idle ends the read of the last chunk. Defaults to 50ms.
	idle time.Duration
}

func (w streamWaits) orDefaults() streamWaits {
	if w.empty <= 0 {
		w.empty = 1500 * time.Millisecond
	}
	if w.idle <= 0 {
		w.idle = 50 * time.Millisecond
	}
	return w
}

var consumerSeq atomic.Int64

func consumerTag(purpose string) string {
	return fmt.Sprintf("dlxbridge-%s-%d-%d", purpose, time.Now().UnixNano(), consumerSeq.Add(1))
}

// errStopRead, returned by a read's fn, ends the read without an error.
var errStopRead = errors.New("stop reading")

// readStream calls fn for each message of the stream, in offset order, up to
// the last one present when it was called, as far as lastOffset finds it:
// a reader that waits less than the broker takes can stop early.
func readStream(ctx context.Context, conn *amqp.Connection, name string, waits streamWaits, fn func(offset int64, d *amqp.Delivery) error) error {
	return readStreamParts(ctx, conn, name, waits, 1, func(_ int, off int64, d *amqp.Delivery) error { return fn(off, d) })
}

// splitFrom is the smallest stream (by last offset) that readStreamParts
// splits: below it, opening more consumers costs more than it saves.
const splitFrom = 4096

// readStreamParts is readStream over parts consecutive offset ranges, each
// read by its own consumer at the same time (the broker serves each from
// its own channel process, and fn runs on each consumer's goroutine): fn
// is called in offset order within a part, with the part's index. The
// ranges split the offsets up to the end evenly; those retention already
// removed are simply not delivered, so a part may see nothing.
func readStreamParts(ctx context.Context, conn *amqp.Connection, name string, waits streamWaits, parts int,
	fn func(part int, offset int64, d *amqp.Delivery) error) error {
	end, found, err := lastOffset(ctx, conn, name, waits.orDefaults())
	if err != nil || !found {
		return err
	}
	if parts < 1 || end < splitFrom {
		parts = 1
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, parts)
	var wg sync.WaitGroup
	for i := range parts {
		lo, hi := end*int64(i)/int64(parts), end*int64(i+1)/int64(parts)-1
		var from any = lo
		if i == 0 {
			lo, from = math.MinInt64, "first"
		}
		if i == parts-1 {
			hi = end
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = consumeFrom(ctx, conn, name, from, func(off int64, d *amqp.Delivery) error {
				switch {
				case off < lo: // in case a broker starts at the chunk that holds lo (3.10.8 does not)
					return nil
				case off > hi:
					return errStopRead
				}
				if err := fn(i, off, d); err != nil {
					return err
				}
				if off >= hi {
					return errStopRead
				}
				return nil
			})
			if errs[i] != nil {
				cancel()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// consumeFrom calls fn for each message of the stream from offset from (a
// number, or "first"), in offset order, until fn returns an error
// (errStopRead: none) or ctx ends. It never stops by itself: fn must know
// the end (readStreamParts, or a marker the caller wrote and had
// confirmed, see Replayer.claim).
func consumeFrom(ctx context.Context, conn *amqp.Connection, name string, from any, fn func(offset int64, d *amqp.Delivery) error) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("read %s: open channel: %w", name, err)
	}
	defer ch.Close()
	if err := ch.Qos(streamPrefetch, 0, false); err != nil {
		return fmt.Errorf("read %s: prefetch: %w", name, err)
	}
	tag := consumerTag("read")
	deliveries, err := ch.Consume(name, tag, false, false, false, false, amqp.Table{"x-stream-offset": from})
	if err != nil {
		return consumeError(name, err)
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
		if n++; n%100 == 0 {
			if err := d.Ack(true); err != nil {
				return fmt.Errorf("read %s: %w", name, err)
			}
		}
		if err := fn(streamOffset(&d), &d); err != nil {
			if errors.Is(err, errStopRead) {
				return nil
			}
			return err
		}
	}
}

// noLocalReplica is how the broker refuses to read a stream to a
// connection on a node without a running member of it (4.3.6: a node of
// the cluster that holds no replica, or one restarted and still catching
// up, as seen for several seconds after a restart).
const noLocalReplica = "does not have a running replica on the local node"

// consumeError says why reading stream name could not start.
func consumeError(name string, err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) && strings.Contains(ae.Reason, noLocalReplica) {
		return fmt.Errorf("read %s: the node this connection is on has no running replica of it (not a member, or catching up after a restart): try again shortly, or connect to another node: %w", name, err)
	}
	return fmt.Errorf("read %s (is it a stream? was the topology applied?): %w", name, err)
}

// readAt returns the first message of the stream at offset or after it.
// The prefetch is one, so that the broker sends one message at a time
// whatever their size (a broker may start at the chunk that holds offset:
// those before it are acked and passed over).
func readAt(ctx context.Context, conn *amqp.Connection, name string, offset int64) (*amqp.Delivery, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("read %s: open channel: %w", name, err)
	}
	defer ch.Close()
	if err := ch.Qos(1, 0, false); err != nil {
		return nil, fmt.Errorf("read %s: prefetch: %w", name, err)
	}
	tag := consumerTag("at")
	deliveries, err := ch.Consume(name, tag, false, false, false, false, amqp.Table{"x-stream-offset": offset})
	if err != nil {
		return nil, consumeError(name, err)
	}
	defer func() { _ = ch.Cancel(tag, false) }()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case d, ok := <-deliveries:
			if !ok {
				return nil, fmt.Errorf("read %s: channel closed", name)
			}
			if streamOffset(&d) >= offset {
				return &d, nil
			}
			if err := d.Ack(false); err != nil {
				return nil, fmt.Errorf("read %s: %w", name, err)
			}
		}
	}
}

// lastOffset finds an offset at the end of the stream; found is false for
// an empty stream.
func lastOffset(ctx context.Context, conn *amqp.Connection, name string, waits streamWaits) (end int64, found bool, err error) {
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
		return 0, false, consumeError(name, err)
	}
	defer func() { _ = ch.Cancel(tag, false) }()
	wait := time.NewTimer(waits.empty)
	defer wait.Stop()
	// A stream written to more often than waits.idle never falls silent:
	// the consumer at "last" follows the writers until its prefetch is
	// full (minutes at a few dozen messages a second). Any offset it has
	// seen is an end that exists, so the wait ends waits.empty after the
	// first delivery, silent or not.
	var enough <-chan time.Time
	end = -1
	for {
		select {
		case <-ctx.Done():
			return 0, false, ctx.Err()
		case <-wait.C:
			return end, end >= 0, nil
		case <-enough:
			return end, end >= 0, nil
		case d, ok := <-deliveries:
			if !ok {
				return 0, false, fmt.Errorf("read %s: channel closed", name)
			}
			if enough == nil {
				limit := time.NewTimer(waits.empty)
				defer limit.Stop()
				enough = limit.C
			}
			end = max(end, streamOffset(&d))
			wait.Reset(waits.idle)
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
