package amqpx

import (
	"errors"
	"fmt"

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

// WatchBlocked calls f for every connection.blocked / connection.unblocked
// the broker sends (resource alarms), until conn closes.
func WatchBlocked(conn *amqp.Connection, f func(amqp.Blocking)) {
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	go func() {
		for b := range blocked {
			f(b)
		}
	}()
}
