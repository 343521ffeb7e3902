package amqpx

import (
	"context"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrConsumerCancelled: the broker cancelled a consumer (its queue was
// deleted, or on some versions a quorum queue's leader moved).
var ErrConsumerCancelled = errors.New("the broker cancelled the consumer")

// WatchConnection returns a channel that receives one error when conn
// closes (nil after a clean Close by this process) and is then closed.
func WatchConnection(conn *amqp.Connection) <-chan error {
	closed := conn.NotifyClose(make(chan *amqp.Error, 1)) // buffered: the client must never block on it
	out := make(chan error, 1)
	go func() {
		defer close(out)
		if e, ok := <-closed; ok && e != nil {
			out <- fmt.Errorf("connection closed: %w", e)
			return
		}
		out <- nil
	}()
	return out
}

// WatchChannel returns a channel that receives one error when ch closes or
// the broker cancels a consumer on it, and is then closed. A cancel that
// arrives after ignoreCancel is closed (the process's own basic.cancel
// during shutdown) is not reported. Both notification channels are
// buffered and drained until ch closes, as amqp091-go requires.
func WatchChannel(ch *amqp.Channel, ignoreCancel <-chan struct{}) <-chan error {
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	cancelled := ch.NotifyCancel(make(chan string, 1))
	out := make(chan error, 1)
	report := func(err error) {
		select {
		case out <- err:
		default: // one report is enough; later ones have no reader
		}
	}
	go func() {
		defer close(out)
		for {
			select {
			case e, ok := <-closed:
				if ok && e != nil {
					report(fmt.Errorf("channel closed: %w", e))
				}
				return
			case tag, ok := <-cancelled:
				if !ok {
					cancelled = nil // closed with the channel; wait for closed
					continue
				}
				select {
				case <-ignoreCancel:
				default:
					report(fmt.Errorf("%w %s", ErrConsumerCancelled, tag))
				}
			}
		}
	}()
	return out
}

// Blocking is what the broker last said about a connection's publishing:
// during a resource alarm (memory or disk) it blocks every connection that
// publishes and stops reading from its socket, so nothing sent on it (a
// publish, a channel open or close, a connection close) is answered until
// the alarm clears. Safe for concurrent use.
type Blocking struct {
	mu        sync.Mutex
	blocked   bool
	reason    string
	unblocked chan struct{} // closed while not blocked
}

// WatchBlocked tracks connection.blocked / connection.unblocked on conn until
// it closes, and calls f (if not nil) for each. A closed connection counts as
// not blocked: whoever waits on it then finds the connection gone.
func WatchBlocked(conn *amqp.Connection, f func(amqp.Blocking)) *Blocking {
	b := &Blocking{unblocked: make(chan struct{})}
	close(b.unblocked)
	// Buffered and always drained: the client's reader blocks on it.
	notes := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	go func() {
		defer b.set(amqp.Blocking{Active: false})
		for n := range notes {
			b.set(n)
			if f != nil {
				f(n)
			}
		}
	}()
	return b
}

func (b *Blocking) set(n amqp.Blocking) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case n.Active && !b.blocked:
		b.blocked, b.reason = true, n.Reason
		b.unblocked = make(chan struct{})
	case !n.Active && b.blocked:
		b.blocked, b.reason = false, ""
		close(b.unblocked)
	}
}

// Blocked reports whether the broker has blocked the connection, and why.
func (b *Blocking) Blocked() (bool, string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.blocked, b.reason
}

// Wait returns nil once the connection is not blocked (at once if it is
// not), or ctx's error if ctx ends first.
func (b *Blocking) Wait(ctx context.Context) error {
	b.mu.Lock()
	unblocked := b.unblocked
	b.mu.Unlock()
	select {
	case <-unblocked:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
