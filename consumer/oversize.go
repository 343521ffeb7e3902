package consumer

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/frame"
)

// A retry or quarantine copy whose body is over the broker's max message
// size (max_message_size) is refused: the broker closes the publishing
// channel with 406 PRECONDITION_FAILED (amqpx.TooLargeError). It counts the
// body alone, on 3.x and 4.x alike, and AMQP 0-9-1 offers no way to read
// the limit, so the runtime learns it from the first refusal on a
// publishing connection (sizeLimit) and from then on checks each failure's
// copy before sending it (overLimit): what cannot be sent is rejected
// without requeue, and the broker, whose dead-lettering checks no size,
// moves it as received into the quarantine (at-least-once dead-lettering,
// see topology). The success path never looks at a size.

// sizeLimit is a publishing connection's max message size as the broker
// named it in a refusal, 0 until then. Safe for concurrent use; a nil
// *sizeLimit knows none.
type sizeLimit struct{ n atomic.Int64 }

func (l *sizeLimit) get() int64 {
	if l == nil {
		return 0
	}
	return l.n.Load()
}

func (l *sizeLimit) learn(n int64) {
	if l != nil && n > 0 {
		l.n.Store(n)
	}
}

// overLimit reports whether a body of size bytes is over limit, the
// broker's max message size (0: not known yet, never over). Only the body
// counts: a body of exactly limit bytes passes with any headers (seen on
// 3.10.8 and 4.0.5).
func overLimit(size int, limit int64) bool { return limit > 0 && int64(size) > limit }

// overLimitError: a copy was not sent, its body being over the broker's
// max message size as learned on this connection.
type overLimitError struct{ size, limit int64 }

func (e *overLimitError) Error() string {
	return fmt.Sprintf("body of %d bytes is over the broker's max message size %d (learned from its refusal on this connection)", e.size, e.limit)
}

// heldBack reports whether err says the runtime did not send a copy at
// all: it does not fit one frame, or its body is over the broker's limit
// as learned on this connection. Nothing was published, so it is no
// failed publish (a broker's refusal, amqpx.TooLargeError, is one). A copy
// held back only on its re-send went out before, beside another's refusal
// (see sentBefore): it is a failed publish.
func heldBack(err error) bool {
	_, ol := errors.AsType[*overLimitError](err)
	return (ol || errors.Is(err, frame.ErrNoFit)) && !errors.Is(err, amqpx.ErrBesideRefusal)
}

// unsendable reports whether err says a copy cannot be published at all
// (no retry could help), and why, as a dead_lettered reason: it does not
// fit one frame (frame.ErrNoFit), or its body is over the broker's
// max message size.
func unsendable(err error) (reason string, ok bool) {
	if _, ok := errors.AsType[*overLimitError](err); ok {
		return deadLetterMaxMessageSize, true
	}
	if errors.Is(err, frame.ErrNoFit) {
		return deadLetterFrameMax, true
	}
	if _, ok := amqpx.IsTooLarge(err); ok {
		return deadLetterMaxMessageSize, true
	}
	return "", false
}
