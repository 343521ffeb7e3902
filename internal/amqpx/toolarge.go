package amqpx

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TooLargeError: the broker refused a publish whose body was over its max
// message size (max_message_size: 16 MiB by default on 4.x, 128 MiB on 3.x).
// It does so by closing the channel with 406 PRECONDITION_FAILED, "message
// size N is larger than configured max size M" ("… than max size M" when
// the limit is the broker's ceiling), before routing the message: no queue
// has it. Only the body counts (headers are bounded by frame_max instead):
// seen on 3.10.8 and 4.0.5, where a body of exactly M passes with any
// headers and one of M+1 is refused. It wraps ErrPublisherClosed: the
// channel is gone.
type TooLargeError struct {
	// Size is the refused body's size, Max the broker's limit, in bytes.
	Size, Max int64
	// Closed is the channel's close.
	Closed error
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("message body of %d bytes is over the broker's max message size %d (%v)", e.Size, e.Max, e.Closed)
}

// Unwrap makes errors.Is(err, ErrPublisherClosed) true.
func (e *TooLargeError) Unwrap() error { return e.Closed }

// ErrBesideRefusal: the publish was unconfirmed when its channel closed
// because the broker refused another publish on it as too large (see
// TooLargeError). Nothing is wrong with this one: sent again on a new
// channel it goes through. Whether the broker has the first copy is
// unknown (written before the refused one, it may have been routed), so a
// second send may make a duplicate, never a loss. Such an error also wraps
// ErrPublisherClosed.
var ErrBesideRefusal = errors.New("another publish on the channel was refused as too large")

// ParseTooLarge reads a size refusal's reply text: the refused size and the
// limit, ok false for any other text.
func ParseTooLarge(text string) (size, max int64, ok bool) {
	const head, mid = "message size ", " is larger than "
	i := strings.Index(text, head)
	if i < 0 {
		return 0, 0, false
	}
	rest := text[i+len(head):]
	j := strings.Index(rest, mid)
	if j < 0 {
		return 0, 0, false
	}
	size, err := strconv.ParseInt(rest[:j], 10, 64)
	if err != nil {
		return 0, 0, false
	}
	rest = rest[j+len(mid):]
	rest = strings.TrimPrefix(rest, "configured ")
	if !strings.HasPrefix(rest, "max size ") {
		return 0, 0, false
	}
	rest = rest[len("max size "):]
	end := 0
	for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
		end++
	}
	max, err = strconv.ParseInt(rest[:end], 10, 64)
	if err != nil || size <= max || max <= 0 {
		return 0, 0, false
	}
	return size, max, true
}

// tooLargeClose returns the refusal a channel close reports, nil if it is
// not one.
func tooLargeClose(e *amqp.Error) *TooLargeError {
	if e == nil || e.Code != amqp.PreconditionFailed {
		return nil
	}
	size, max, ok := ParseTooLarge(e.Reason)
	if !ok {
		return nil
	}
	return &TooLargeError{Size: size, Max: max, Closed: fmt.Errorf("%w: %v", ErrPublisherClosed, e)}
}

// IsTooLarge reports whether err is a size refusal, and the limit it named.
func IsTooLarge(err error) (max int64, ok bool) {
	if tl, ok := errors.AsType[*TooLargeError](err); ok {
		return tl.Max, true
	}
	return 0, false
}
