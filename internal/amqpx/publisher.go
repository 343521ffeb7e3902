package amqpx

import (
	"context"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrUnroutable: the broker returned a mandatory message (basic.return):
// no queue got it. The broker still acks such a message, so without
// mandatory it would have vanished silently.
var ErrUnroutable = errors.New("message unroutable: no queue is bound for it")

// ErrNacked: the broker refused the message (basic.nack), e.g. a full queue
// with x-overflow=reject-publish.
var ErrNacked = errors.New("broker nacked the message")

// ErrPublisherClosed: the channel is gone; open a new Publisher.
var ErrPublisherClosed = errors.New("publisher channel closed")

// ReturnedError carries the broker's basic.return.
type ReturnedError struct {
	Exchange   string
	RoutingKey string
	ReplyCode  uint16
	ReplyText  string
}

func (e *ReturnedError) Error() string {
	return fmt.Sprintf("%v (exchange %q, routing key %q: %d %s)", ErrUnroutable, e.Exchange, e.RoutingKey, e.ReplyCode, e.ReplyText)
}

// Unwrap makes errors.Is(err, ErrUnroutable) true.
func (e *ReturnedError) Unwrap() error { return ErrUnroutable }

// Publisher publishes one message at a time on its own confirm-mode channel
// with mandatory set, and returns only once the broker has confirmed it:
// nil means a queue has it (for quorum queues, a majority). A basic.return,
// a nack, a closed channel or a cancelled context is an error, and the
// message must be treated as not sent.
//
// One publish is in flight at a time, so a basic.return (which the broker
// sends before the ack) always belongs to the current message. After an
// error other than ErrUnroutable/ErrNacked the channel is closed and every
// later call fails with ErrPublisherClosed; make a new Publisher.
// Safe for concurrent use (calls are serialized).
//
// Nothing waits on the broker without a bound: a publish waits for its
// confirm until ctx ends or Close is called, and closing the channel waits
// at most CloseTimeout. During a resource alarm the broker reads nothing
// from a publishing connection, so neither a confirm nor a close-ok comes
// until it clears; a close is then abandoned, and completes when the broker
// answers or the connection is closed.
type Publisher struct {
	mu       sync.Mutex
	ch       *amqp.Channel
	confirms chan amqp.Confirmation
	returns  chan amqp.Return
	closed   chan *amqp.Error
	broken   error

	closeOnce sync.Once
	closing   chan struct{} // closed by Close: ends a publish waiting for its confirm

	// afterWrite, if set, runs once a publish is written, before its
	// confirm is awaited (a test hook: see export_test.go).
	afterWrite func()
}

// NewPublisher opens a confirm-mode channel on conn.
func NewPublisher(conn *amqp.Connection) (*Publisher, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open publisher channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	p := &Publisher{
		ch: ch,
		// Buffered: with one publish in flight at most one confirm and one
		// return are pending; the extra room keeps the client's reader from
		// ever blocking on us.
		confirms: ch.NotifyPublish(make(chan amqp.Confirmation, 8)),
		returns:  ch.NotifyReturn(make(chan amqp.Return, 8)),
		closed:   ch.NotifyClose(make(chan *amqp.Error, 1)),
		closing:  make(chan struct{}),
	}
	return p, nil
}

// NewPublisherContext is NewPublisher bounded by ctx: opening a channel
// waits for the broker, which answers nothing on a connection it has
// blocked (a resource alarm) until the alarm clears. If ctx ends first, the
// open is abandoned and its channel closed whenever it completes.
func NewPublisherContext(ctx context.Context, conn *amqp.Connection) (*Publisher, error) {
	return openWithin(ctx, func() (*Publisher, error) { return NewPublisher(conn) }, func(p *Publisher) {
		p.mu.Lock()
		_ = p.breakWith(nil)
		p.mu.Unlock()
	})
}

// openWithin runs open, waiting for it until ctx ends; an open that
// completes after that is discarded.
func openWithin[T any](ctx context.Context, open func() (T, error), discard func(T)) (T, error) {
	type opened struct {
		v   T
		err error
	}
	res := make(chan opened, 1)
	go func() {
		v, err := open()
		res <- opened{v, err}
	}()
	select {
	case r := <-res:
		return r.v, r.err
	case <-ctx.Done():
		go func() {
			if r := <-res; r.err == nil {
				discard(r.v)
			}
		}()
		var zero T
		return zero, fmt.Errorf("open publisher channel: %w", context.Cause(ctx))
	}
}

// Publish sends msg to exchange with routing key, mandatory, and waits for
// the confirm.
func (p *Publisher) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.broken != nil {
		return p.broken
	}
	seq := p.ch.GetNextPublishSeqNo()
	if err := p.ch.PublishWithContext(ctx, exchange, key, true, false, msg); err != nil {
		return p.breakWith(fmt.Errorf("publish: %w", err))
	}
	if p.afterWrite != nil {
		p.afterWrite()
	}
	var returned *ReturnedError
	returns := p.returns // nil once closed: a closed channel is always ready
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			returned = returnedError(r)
		case c, ok := <-p.confirms:
			if !ok {
				return p.breakWith(ErrPublisherClosed)
			}
			if c.DeliveryTag < seq {
				continue // a confirm for an earlier publish; cannot happen while serialized
			}
			return p.outcome(c, returned)
		case e := <-p.closed:
			// The broker may have confirmed the message before it closed
			// the channel: the client hands that confirm over before the
			// close, but on a Go channel of its own, which the select may
			// not have picked yet.
			if c, ok := p.confirmHandedOver(seq); ok {
				_ = p.breakWith(nil)
				return p.outcome(c, returned)
			}
			if e != nil {
				return p.breakWith(fmt.Errorf("%w: %v", ErrPublisherClosed, e))
			}
			return p.breakWith(ErrPublisherClosed)
		case <-ctx.Done():
			// The confirm may still come; this channel can no longer tell
			// whose it is, so it is retired.
			return p.breakWith(fmt.Errorf("waiting for publisher confirm: %w", context.Cause(ctx)))
		case <-p.closing:
			return p.breakWith(fmt.Errorf("waiting for publisher confirm: %w", ErrPublisherClosed))
		}
	}
}

// outcome is the result of the publish that c confirms, returned being its
// basic.return if one came. The return precedes the ack on the wire and the
// client delivers it first; a late one is drained to be sure.
func (p *Publisher) outcome(c amqp.Confirmation, returned *ReturnedError) error {
	select {
	case r, ok := <-p.returns:
		if ok {
			returned = returnedError(r)
		}
	default:
	}
	switch {
	case returned != nil:
		return returned
	case !c.Ack:
		return ErrNacked
	default:
		return nil
	}
}

// confirmHandedOver returns the confirm of publish seq if the client has
// handed it over already.
func (p *Publisher) confirmHandedOver(seq uint64) (amqp.Confirmation, bool) {
	for {
		select {
		case c, ok := <-p.confirms:
			if !ok {
				return amqp.Confirmation{}, false
			}
			if c.DeliveryTag >= seq {
				return c, true
			}
		default:
			return amqp.Confirmation{}, false
		}
	}
}

func returnedError(r amqp.Return) *ReturnedError {
	return &ReturnedError{Exchange: r.Exchange, RoutingKey: r.RoutingKey, ReplyCode: r.ReplyCode, ReplyText: r.ReplyText}
}

// breakWith retires the channel after err. Its close is not awaited: on a
// blocked connection the close-ok would not come before the alarm clears.
func (p *Publisher) breakWith(err error) error {
	if p.broken == nil {
		p.broken = ErrPublisherClosed
		_ = CloseChannel(p.ch, 0)
	}
	return err
}

// Close ends a publish that waits for its confirm (it returns
// ErrPublisherClosed: treat that message as not sent) and closes the
// channel. It waits at most CloseTimeout for the broker's close-ok; past
// that it returns an error wrapping ErrCloseAbandoned, and the close
// completes when the broker answers or the connection closes. Either way
// the Publisher is closed. The connection stays open.
func (p *Publisher) Close() error {
	p.closeOnce.Do(func() { close(p.closing) })
	closed := start(func() error {
		// A publish still writing to a socket the broker doesn't read
		// holds mu: that too is waited for only up to the bound.
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.broken != nil {
			return nil
		}
		p.broken = ErrPublisherClosed
		return p.ch.Close()
	})
	if ok, err := await(closed, CloseTimeout); ok {
		return err
	}
	return fmt.Errorf("%w: no publisher channel close-ok within %s", ErrCloseAbandoned, CloseTimeout)
}
