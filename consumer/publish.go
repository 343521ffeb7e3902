package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/quarantine"
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

// sessionPublisher is a worker's confirmer: a confirm pipeline on the
// session's publishing connection, opened on first use. Each worker has its
// own; mu lets a re-send (see Publish) share it.
type sessionPublisher struct {
	s    *queueSession
	mu   sync.Mutex
	pipe *amqpx.Pipeline
}

// close fails what still awaits a confirm and closes the pipeline's
// channel (without waiting for the close-ok: during a resource alarm none
// comes, and the channel closes with the publishing connection, which the
// session closes next).
func (sp *sessionPublisher) close() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.pipe != nil {
		sp.pipe.Close()
		sp.pipe = nil
	}
}

// retire closes pipe, broken by a publish, unless a re-send has replaced it
// already (then the one in use stays).
func (sp *sessionPublisher) retire(pipe *amqpx.Pipeline) {
	sp.mu.Lock()
	if sp.pipe == pipe {
		sp.pipe = nil
	}
	sp.mu.Unlock()
	pipe.Close()
}

// pipeline returns the confirm pipeline, opening one if needed: one whose
// channel died is replaced.
func (sp *sessionPublisher) pipeline() (*amqpx.Pipeline, error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.pipe != nil {
		if !sp.pipe.Broken() {
			return sp.pipe, nil
		}
		sp.pipe = nil // it ends by itself once it has failed what it held
	}
	p, err := amqpx.NewPipeline(sp.s.handlerCtx, sp.s.pubConn, pipelineDepth)
	if err != nil {
		return nil, err
	}
	sp.pipe = p
	go sp.s.watchConfirms(p)
	return p, nil
}

// Publish sends with confirm + mandatory on the pipeline.
//
// While the broker blocks the publishing connection (a resource alarm) it
// reads nothing from it: a publish, or opening a channel for one, would only
// wait, and a timeout would requeue the message and run its handler again
// for nothing. So publish first waits for the unblock, holding the delivery,
// until the drain deadline.
//
// A publish in flight when the broker closed the channel for another one's
// size (amqpx.ErrBesideRefusal) is sent again, on a new channel, before
// confirmed hears of it (see resending): one oversized copy costs the
// others on the channel nothing but, at worst, a duplicate.
func (sp *sessionPublisher) Publish(ctx context.Context, exchange, key string, p amqp.Publishing, confirmed func(error)) {
	sp.publish(ctx, exchange, key, p, sp.resending(ctx, exchange, key, p, confirmed, maxResends))
}

// maxResends bounds how often one publish is sent again after refusals of
// others (each refusal takes one oversized publish out of the pipeline,
// and the limit it teaches holds the later ones back, so a second round is
// already rare).
const maxResends = 4

// resending wraps confirmed: a publish failed beside another's refusal is
// sent again (up to left times), and a refusal teaches the connection the
// broker's limit at once, before the publishes failed beside it are sent
// again.
func (sp *sessionPublisher) resending(ctx context.Context, exchange, key string, p amqp.Publishing, confirmed func(error), left int) func(error) {
	return func(err error) {
		if max, ok := amqpx.IsTooLarge(err); ok {
			sp.s.maxSize.learn(max)
		}
		if left > 0 && errors.Is(err, amqpx.ErrBesideRefusal) && sp.s.handlerCtx.Err() == nil {
			// Called on the pipeline's goroutine, which must not block
			// (nor open a channel).
			go sp.publish(ctx, exchange, key, p, sp.resending(ctx, exchange, key, p, confirmed, left-1))
			return
		}
		confirmed(err)
	}
}

// publish sends p on the pipeline, unless its body is over the broker's
// limit as learned on this connection (*overLimitError: sent, it would
// close the channel under the others).
func (sp *sessionPublisher) publish(ctx context.Context, exchange, key string, p amqp.Publishing, confirmed func(error)) {
	if limit := sp.s.maxSize.get(); overLimit(len(p.Body), limit) {
		confirmed(&overLimitError{size: int64(len(p.Body)), limit: limit})
		return
	}
	if err := sp.s.blocking.Wait(sp.s.handlerCtx); err != nil {
		_, reason := sp.s.blocking.Blocked()
		confirmed(fmt.Errorf("the broker blocks publishing (%s) and the runtime is stopping: %w", reason, err))
		return
	}
	pipe, err := sp.pipeline()
	if err == nil {
		err = pipe.Publish(context.WithoutCancel(ctx), exchange, key, p, confirmed)
	}
	if err != nil {
		// An error of this publish's own leaves the others in flight on
		// the pipeline: failing them would requeue originals whose copies
		// the broker may well confirm.
		if pipe != nil && errors.Is(err, amqpx.ErrPublisherClosed) {
			sp.retire(pipe)
		}
		confirmed(err)
	}
}

// publishTimeout bounds the wait for a publisher confirm while the
// publishing connection is not blocked.
const publishTimeout = 30 * time.Second

// errConfirmTimeout ends a confirm wait that took publishTimeout.
var errConfirmTimeout = fmt.Errorf("no publisher confirm within %s", publishTimeout)

// watchConfirms bounds p's confirm waits: at the drain deadline, and when
// the oldest unconfirmed publish has waited publishTimeout while the
// publishing connection is not blocked, p fails what it holds (whether the
// broker has those copies is unknown). While the broker blocks the
// connection a confirm comes only after the unblock, so the wait goes on
// until it, and publishTimeout more.
func (qs *queueSession) watchConfirms(p *amqpx.Pipeline) {
	tick := time.NewTicker(min(publishTimeout/4, time.Second))
	defer tick.Stop()
	var blockedUntil time.Time
	for {
		select {
		case <-p.Done():
			return
		case <-qs.handlerCtx.Done():
			p.Fail(context.Cause(qs.handlerCtx))
			return
		case <-tick.C:
		}
		if blocked, _ := qs.blocking.Blocked(); blocked {
			blockedUntil = time.Now()
			continue
		}
		if sent, ok := p.Oldest(); ok && time.Since(later(sent, blockedUntil)) >= publishTimeout {
			p.Fail(errConfirmTimeout)
			return
		}
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// unsendable reports whether err says a copy cannot be published at all
// (no retry could help), and why, as a dead_lettered reason: it does not
// fit one frame (quarantine.ErrNoFit), or its body is over the broker's
// max message size.
func unsendable(err error) (reason string, ok bool) {
	var ol *overLimitError
	switch {
	case errors.As(err, &ol):
		return deadLetterMaxMessageSize, true
	case errors.Is(err, quarantine.ErrNoFit):
		return deadLetterFrameMax, true
	}
	if _, ok := amqpx.IsTooLarge(err); ok {
		return deadLetterMaxMessageSize, true
	}
	return "", false
}

// pipelineDepth bounds a worker's retry and quarantine publishes awaiting
// their confirms: past it the worker waits for one before it takes the next
// delivery.
const pipelineDepth = 64
