package amqpx

import (
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrCloseAbandoned: the broker did not confirm a close in time (a
// connection blocked by a resource alarm never does until the alarm
// clears), so the close was not awaited.
var ErrCloseAbandoned = errors.New("close abandoned")

// CloseTimeout is how long the runtime and the publishers wait for the
// broker's close-ok before they abandon a close.
const CloseTimeout = time.Second

// CloseConnection closes conn, waiting at most within for the broker's
// close-ok. Past that (a blocked connection gets no answer until the alarm
// clears; a stuck broker none at all) the socket is closed under it: every
// call still waiting on conn returns, and its channels and notifications
// end. It returns nil if the broker confirmed the close.
func CloseConnection(conn *amqp.Connection, within time.Duration) error {
	if conn.IsClosed() {
		return nil
	}
	done := start(conn.Close)
	if within > 0 {
		if ok, err := await(done, within); ok {
			return err
		}
	}
	// A deadline already passed makes every read and write on the socket
	// fail at once (a write stuck on a full socket too); amqp091-go then
	// shuts the connection down and closes the socket, which ends the Close
	// above.
	_ = conn.CloseDeadline(time.Now())
	if err := <-done; err == nil {
		return nil // the close-ok came after all
	}
	return fmt.Errorf("%w: no close-ok within %s; the socket was closed", ErrCloseAbandoned, within)
}

// CloseChannel closes ch, waiting at most within for the broker's close-ok
// (none comes on a blocked connection). Past that the close is abandoned: it
// completes when the broker answers or the connection closes, and until then
// ch is not usable. Whoever owns the connection bounds that by closing it
// with CloseConnection.
func CloseChannel(ch *amqp.Channel, within time.Duration) error {
	if ok, err := await(start(ch.Close), within); ok {
		return err
	}
	return fmt.Errorf("%w: no channel close-ok within %s", ErrCloseAbandoned, within)
}

// start runs f on a goroutine of its own; its result arrives on the
// returned channel.
func start(f func() error) <-chan error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	return done
}

// await waits at most d for done's result; ok is false if d passed first
// (whatever sends on done then finishes in the background).
func await(done <-chan error, d time.Duration) (ok bool, err error) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case err := <-done:
		return true, err
	case <-timer.C:
		return false, nil
	}
}
