package brokertest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
)

// Changes is a test's signal instead of a sleep: code that changes some
// state under a mutex calls Notify after it, and WaitFor waits, woken by
// each Notify, until a condition on that state holds. Make one with
// NewChanges.
type Changes chan struct{}

// NewChanges makes a Changes.
func NewChanges() Changes { return make(Changes, 1) }

// Notify wakes a WaitFor; it never blocks.
func (c Changes) Notify() {
	select {
	case c <- struct{}{}:
	default:
	}
}

// WaitFor waits until cond, called with mu held, holds (true), or within
// passes (false).
func (c Changes) WaitFor(mu *sync.Mutex, cond func() bool, within time.Duration) bool {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		mu.Lock()
		ok := cond()
		mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-c:
		case <-deadline.C:
			return false
		}
	}
}

// Run runs run until the test ends or stop is called: stop cancels run's
// context and waits up to within for it to return, and fails the test if it
// returned an error or did not return. stop may be called more than once.
func Run(t testing.TB, within time.Duration, run func(ctx context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(within):
				t.Errorf("Run did not return within %s of cancel", within)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// Drain consumes queue on a connection of its own named name, passes each
// delivery to each and then acks it, until ctx ends (nil) or the consumer
// or an ack fails.
func Drain(ctx context.Context, url, name, queue string, each func(*amqp.Delivery)) error {
	conn, err := amqpx.Dial(url, name)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Qos(100, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-deliveries:
			if !ok {
				return fmt.Errorf("the consumer of %s ended", queue)
			}
			each(&d)
			if err := d.Ack(false); err != nil {
				return err
			}
		}
	}
}
