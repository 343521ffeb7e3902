package amqpx

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Pipeline publishes with confirm + mandatory without waiting for each
// confirm: Publish returns once the message is written, and its done func
// is called once, from the pipeline's own goroutine, with nil when the
// broker confirmed it (a queue has it) or with an error: a basic.return
// (*ReturnedError), a nack (ErrNacked), the channel's loss
// (ErrPublisherClosed; a *TooLargeError for the publish whose size made the
// broker close it, ErrBesideRefusal for the others then in flight), or
// Fail's cause. A done func must not block.
//
// Confirms come in publish order (the client resequences them); a
// basic.return reaches the client before its message's confirm, and
// returns come in publish order too. So when a confirm arrives, the oldest
// return not yet matched is either its message's or a later one's, and it
// is its message's only if exchange, routing key, message id and body
// agree. Those four do not tell identical messages apart (a headers
// exchange, or a binding that went away between them, can route one and
// return the other): when a confirm takes such a return, every identical
// publish still unconfirmed counts as returned too, since the return may
// have been its own. A copy may then exist twice, never not at all.
//
// Safe for concurrent use.
type Pipeline struct {
	ch       *amqp.Channel
	confirms chan amqp.Confirmation
	returns  chan amqp.Return
	closed   chan *amqp.Error

	mu       sync.Mutex
	inFlight []*inFlight // by sequence number
	returned []amqp.Return
	broken   error

	failOnce sync.Once
	fail     chan error // Fail's cause
	exited   chan struct{}
}

type inFlight struct {
	seq           uint64
	exchange, key string
	msg           *amqp.Publishing
	sent          time.Time
	done          func(error)
	// twinReturned: an identical earlier publish took a return that may
	// have been this one's.
	twinReturned *ReturnedError
}

// NewPipeline opens a confirm-mode channel on conn for up to max
// unconfirmed publishes, bounded by ctx like NewPublisherContext.
func NewPipeline(ctx context.Context, conn *amqp.Connection, max int) (*Pipeline, error) {
	return openWithin(ctx, func() (*Pipeline, error) { return newPipeline(conn, max) }, (*Pipeline).Close)
}

func newPipeline(conn *amqp.Connection, max int) (*Pipeline, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open publisher channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = CloseChannel(ch, 0)
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	// The client's reader blocks on a full notify channel: room for every
	// confirm and return that can be pending, read at once below.
	p := &Pipeline{
		ch:       ch,
		confirms: ch.NotifyPublish(make(chan amqp.Confirmation, max+8)),
		returns:  ch.NotifyReturn(make(chan amqp.Return, max+8)),
		closed:   ch.NotifyClose(make(chan *amqp.Error, 1)),
		fail:     make(chan error, 1),
		exited:   make(chan struct{}),
	}
	go p.run()
	return p, nil
}

// Publish writes msg to exchange with routing key and mandatory set; done
// follows (see Pipeline). An error means nothing was sent and done will not
// be called. One that wraps ErrPublisherClosed broke the pipeline (its
// channel is gone, or a write failed part way: make a new one) and failed
// what it held (one that also wraps ErrBesideRefusal was refused because
// the broker closed the channel for another publish's size: nothing is
// wrong with it); any other concerns msg alone (ctx ended, or a header
// value AMQP cannot carry, found before anything was written), and the
// publishes in flight go on.
func (p *Pipeline) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing, done func(error)) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("not published: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.broken != nil {
		return p.broken
	}
	f := &inFlight{seq: p.ch.GetNextPublishSeqNo(), exchange: exchange, key: key, msg: &msg, sent: time.Now(), done: done}
	if err := p.ch.PublishWithContext(ctx, exchange, key, true, false, msg); err != nil {
		if verr := msg.Headers.Validate(); verr != nil {
			// The client checks the headers first, before it takes a
			// sequence number or writes a byte: checked here only once the
			// client refused, not walked twice for every publish.
			return fmt.Errorf("not published: %w", verr)
		}
		if errors.Is(err, amqp.ErrClosed) {
			// Nothing was written: the channel closed a moment ago, and
			// its close is on its way to run, which fails what is in
			// flight with the close's cause. This publish gets the same
			// (one refused beside another's size refusal learns so).
			p.mu.Unlock()
			t := time.NewTimer(CloseTimeout)
			select {
			case <-p.exited:
			case <-t.C:
			}
			t.Stop()
			p.mu.Lock()
		}
		// Past the checks above only the channel or the connection fails
		// a publish, which may have written part of it.
		p.breakLocked(fmt.Errorf("publish: %w", err))
		return p.broken
	}
	p.inFlight = append(p.inFlight, f)
	return nil
}

// Oldest is when the oldest unconfirmed publish was written; ok is false
// when none is.
func (p *Pipeline) Oldest() (sent time.Time, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.inFlight) == 0 {
		return time.Time{}, false
	}
	return p.inFlight[0].sent, true
}

// Fail retires the pipeline: every unconfirmed publish's done gets err
// (treat those messages as not sent), later publishes fail, and the channel
// is closed without waiting for the broker's close-ok. It returns once the
// done funcs have been called.
func (p *Pipeline) Fail(err error) {
	p.failOnce.Do(func() { p.fail <- err })
	<-p.exited
}

// Close is Fail with ErrPublisherClosed.
func (p *Pipeline) Close() { p.Fail(ErrPublisherClosed) }

func (p *Pipeline) run() {
	defer close(p.exited)
	for {
		select {
		case r, ok := <-p.returns:
			if !ok {
				// The client closes the returns before the confirms:
				// confirms may still be buffered; a closed channel must
				// not be read again (it never blocks).
				p.mu.Lock()
				p.returns = nil
				p.mu.Unlock()
				continue
			}
			p.mu.Lock()
			p.returned = append(p.returned, r)
			p.mu.Unlock()
		case c, ok := <-p.confirms:
			if !ok {
				// The client hands the close's cause to p.closed (and then
				// closes it) before it closes the confirms: it is there.
				p.failClosed(<-p.closed)
				return
			}
			p.confirm(c)
		case e := <-p.closed:
			p.settleHandedOver()
			p.failClosed(e)
			return
		case err := <-p.fail:
			p.settleHandedOver()
			p.failAll(err)
			return
		}
	}
}

// settleHandedOver settles the publishes whose confirms the client has
// handed over already, before what is left is failed. The client hands a
// channel's close over after every confirm the broker sent before it, but
// on a Go channel of its own: a select may pick the close first, and a
// publish the broker confirmed would then fail (its original requeued
// while its copy is in a queue, or the copy sent again).
func (p *Pipeline) settleHandedOver() {
	for {
		select {
		case c, ok := <-p.confirms:
			if !ok {
				return
			}
			p.confirm(c)
		default:
			return
		}
	}
}

// confirm settles the publish c confirms.
func (p *Pipeline) confirm(c amqp.Confirmation) {
	p.mu.Lock()
	// A return precedes its message's confirm: take what came with it.
	for more := true; more; {
		select {
		case r, ok := <-p.returns:
			if !ok {
				p.returns, more = nil, false
				break
			}
			p.returned = append(p.returned, r)
		default:
			more = false
		}
	}
	var f *inFlight
	if len(p.inFlight) > 0 && p.inFlight[0].seq == c.DeliveryTag {
		f, p.inFlight[0] = p.inFlight[0], nil
		p.inFlight = p.inFlight[1:]
	}
	var err error
	if f != nil && len(p.returned) > 0 && returnOf(&p.returned[0], f) {
		r := p.returned[0]
		p.returned = p.returned[1:]
		re := &ReturnedError{Exchange: r.Exchange, RoutingKey: r.RoutingKey, ReplyCode: r.ReplyCode, ReplyText: r.ReplyText}
		err = re
		for _, g := range p.inFlight {
			if g.twinReturned == nil && returnOf(&r, g) {
				g.twinReturned = re
			}
		}
	} else if f != nil && f.twinReturned != nil {
		err = f.twinReturned
	} else if !c.Ack {
		err = ErrNacked
	}
	p.mu.Unlock()
	if f != nil {
		f.done(err)
	}
}

func returnOf(r *amqp.Return, f *inFlight) bool {
	return r.Exchange == f.exchange && r.RoutingKey == f.key && r.MessageId == f.msg.MessageId &&
		string(r.Body) == string(f.msg.Body)
}

// failClosed fails what is unconfirmed after the channel closed with e (nil
// for a close of the client's own). A size refusal (see TooLargeError) is
// the refused publish's alone: it gets the TooLargeError, and the others
// ErrBesideRefusal. The broker refuses a publish before routing it, so that
// one is known not to have reached any queue; of the others, those written
// before it may have, those after it were discarded.
func (p *Pipeline) failClosed(e *amqp.Error) {
	if e == nil {
		p.failAll(ErrPublisherClosed)
		return
	}
	tl := tooLargeClose(e)
	if tl == nil {
		p.failAll(fmt.Errorf("%w: %v", ErrPublisherClosed, e))
		return
	}
	beside := fmt.Errorf("%w: %w", ErrBesideRefusal, tl.Closed)
	p.mu.Lock()
	if p.broken == nil {
		// Later publishes are refused with it too: nothing is wrong
		// with them either.
		p.broken = beside
		_ = CloseChannel(p.ch, 0)
	}
	pending := p.inFlight
	p.inFlight = nil
	p.mu.Unlock()
	refused := false
	for _, f := range pending {
		if !refused && int64(len(f.msg.Body)) == tl.Size {
			refused = true // one refusal: the first publish of that size
			f.done(tl)
			continue
		}
		f.done(beside)
	}
}

// failAll breaks the pipeline and fails what is unconfirmed.
func (p *Pipeline) failAll(err error) {
	p.mu.Lock()
	p.breakLocked(err)
	pending := p.inFlight
	p.inFlight = nil
	p.mu.Unlock()
	for _, f := range pending {
		f.done(err)
	}
}

func (p *Pipeline) breakLocked(err error) {
	if p.broken == nil {
		p.broken = fmt.Errorf("%w (after: %v)", ErrPublisherClosed, err)
		_ = CloseChannel(p.ch, 0)
	}
}

// Broken reports whether the pipeline takes no more publishes; it may
// still be failing what it held (see Done).
func (p *Pipeline) Broken() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.broken != nil
}

// Done is closed once the pipeline is broken and has failed what it held.
func (p *Pipeline) Done() <-chan struct{} { return p.exited }
