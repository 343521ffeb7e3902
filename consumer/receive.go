package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/triage"
)

// fedDelivery is a delivery the feeder hands to a worker, with the breaker's
// ticket when the breaker admitted it.
type fedDelivery struct {
	h        *held
	ticket   triage.Ticket
	admitted bool
}

// held is a delivery from the moment the feeder takes it up until it is
// settled: the one allocation that carries it (a delivery is some 300
// bytes) from the feeder through the worker and the ack window to its
// settlement. It is the delivery's acker (a sessionDelivery), and it keeps
// the outcome of an ack until the ack is written (see worker.ack), so that
// neither the delivery nor its outcome is copied to the heap again on the
// way.
type held struct {
	d amqp.Delivery
	s *queueSession
	// The ack's outcome, from worker.ack until its report.
	w      *worker
	o      outcome
	result Outcome
}

// hold takes d up for qs.
func (qs *queueSession) hold(d *amqp.Delivery) *held {
	return &held{d: *d, s: qs}
}

func (h *held) Ack(report func(error)) { sessionDelivery{s: h.s, d: &h.d}.Ack(report) }
func (h *held) Requeue() error         { return sessionDelivery{s: h.s, d: &h.d}.Requeue() }
func (h *held) Reject() error          { return sessionDelivery{s: h.s, d: &h.d}.Reject() }

// ack is ackOutcome for a handler's success or a confirmed copy: a
// delivery the feeder took up keeps the outcome itself until its ack is
// written, so that the outcome is not copied to the heap for the report,
// once per message.
func (w *worker) ack(o outcome, result Outcome) {
	h, ok := o.a.(*held)
	if !ok {
		w.ackOutcome(o, result)
		return
	}
	h.w, h.o, h.result = w, o, result
	h.Ack(h.acked)
}

// acked is the report of an ack asked for by worker.ack.
func (h *held) acked(err error) { h.w.acked(&h.o, h.result, err) }

// errStopped: the session is stopping; no subscription is started.
var errStopped = errors.New("stopping")

// subscription is a queue session's basic.consume, which the breaker
// cancels after maxHold and renews. Its lock serializes the channel's
// synchronous methods (basic.qos, basic.consume, basic.cancel): the client
// does not match concurrent replies on one channel.
type subscription struct {
	qs      *queueSession
	mu      sync.Mutex
	tag     string // the active consumer's, "" when none
	n       int    // subscriptions so far, for their tags
	stopped bool
	// prefetch is the basic.qos of the latest start, which sync repeats.
	prefetch int
}

// sync returns once the broker has read every frame written on the
// channel before it, the acks included: basic.qos is synchronous, and this
// one sets the prefetch the channel already has.
func (s *subscription) sync() error {
	if s == nil { // a worker without a consume (settlement tests)
		return nil
	}
	s.mu.Lock()
	prefetch := s.prefetch
	s.mu.Unlock()
	if prefetch == 0 {
		return nil
	}
	return s.qs.ch.Qos(prefetch, 0, false)
}

// start sets the prefetch and consumes.
func (s *subscription) start(ctx context.Context, prefetch int) (<-chan amqp.Delivery, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	qs := s.qs
	if s.stopped {
		return nil, errStopped
	}
	if err := qs.ch.Qos(prefetch, 0, false); err != nil {
		return nil, fmt.Errorf("queue %q: set prefetch: %w", qs.q.cfg.Name, err)
	}
	s.prefetch = prefetch
	s.n++
	tag := qs.tag
	if s.n > 1 {
		tag = fmt.Sprintf("%s-%d", qs.tag, s.n)
	}
	deliveries, err := qs.ch.ConsumeWithContext(context.WithoutCancel(ctx), qs.q.cfg.Name, tag, false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("queue %q: consume (was the topology applied?): %w", qs.q.cfg.Name, err)
	}
	s.tag = tag
	return deliveries, nil
}

// pause cancels the active consumer, if any, holding the session's
// settlements from the basic.cancel to the cancel-ok (see
// queueSession.settle). The client then hands over what was delivered
// before the cancel-ok and closes the delivery channel.
func (s *subscription) pause() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tag == "" || s.stopped {
		return
	}
	qs := s.qs
	gate := make(chan struct{})
	qs.settleMu.Lock()
	qs.pausing = gate
	qs.settleMu.Unlock()
	_ = qs.ch.Cancel(s.tag, false) // an error means the channel is gone: the watch reports it
	s.tag = ""
	close(gate)
}

// stop cancels the active consumer for good (the session's stop).
func (s *subscription) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	if s.tag != "" {
		_ = s.qs.ch.Cancel(s.tag, false)
		s.tag = ""
	}
}

// state reports whether a consumer is active, and whether the
// subscription was stopped.
func (s *subscription) state() (active, stopped bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tag != "", s.stopped
}

// feed runs the session's feeder (docs/breaker.md) until the
// session stops: it hands every delivery of the subscription to the
// workers on qs.fed, admitted by the breaker when the queue has one, and
// closes qs.fed when the last subscription has ended. src is the first
// subscription's deliveries, nil if the session started paused.
func (qs *queueSession) feed(ctx context.Context, src <-chan amqp.Delivery, lost chan<- error) {
	defer close(qs.fed)
	qb := qs.q.breaker
	var kick chan struct{}
	if qb != nil {
		kick = qb.kick
	}
	var pausedAt time.Time // when the feeder began holding src's deliveries
	for {
		if src == nil {
			var err error
			if src, err = qs.resume(ctx); src == nil {
				if err != nil && !errors.Is(err, errStopped) {
					report(lost, err)
				}
				return
			}
			pausedAt = time.Time{}
		}
		// An open breaker turns half-open when its period ends, even with
		// no delivery to admit (a queue gone quiet).
		select {
		case <-qb.openEnds():
			qb.tick()
		case d, ok := <-src:
			if !ok {
				active, stopped := qs.sub.state()
				if stopped || active {
					// Stopped, or not ended by the runtime: the channel
					// closed or the broker cancelled the consumer (the
					// queue was deleted, say), which the channel's watch
					// reports.
					return
				}
				src = nil // paused: consume again when the breaker allows
				continue
			}
			h := qs.hold(&d)
			qs.received(&h.d)
			if !qs.hand(h, &pausedAt) {
				qs.leave(h)
				return
			}
		case <-kick:
			// A transition while no delivery is in hand: the next one is
			// admitted under the new state.
		case <-qs.handlerCtx.Done():
			return
		}
	}
}

// resume waits while the breaker is open, then consumes again (the breaker
// admits the deliveries). It returns nil when the session stops first.
func (qs *queueSession) resume(ctx context.Context) (<-chan amqp.Delivery, error) {
	qb := qs.q.breaker
	prefetch := qs.q.cfg.Consumer.Prefetch
	if qb != nil {
		for {
			state, until, _ := qb.b.Status()
			wait := until.Sub(qs.deps.cfg.Now())
			if state != triage.BreakerOpen {
				break
			}
			if wait <= 0 {
				qb.tick()
				break
			}
			if !qs.sleep(wait, qb.kick) {
				return nil, nil
			}
		}
	}
	return qs.sub.start(ctx, prefetch)
}

// hand admits d and hands it to a worker. While the breaker says pause or
// hold it keeps d (unacked), up to maxHold after pausedAt; past that it
// cancels the subscription and hands d over as if the breaker were closed.
// A stopping session hands d over as it is: the drain handles what was
// delivered. It reports false when the session's handlers were cancelled
// (d is left for the channel close to requeue).
func (qs *queueSession) hand(d *held, pausedAt *time.Time) bool {
	qb := qs.q.breaker
	send := func(f fedDelivery, kick chan struct{}) (sent, kicked bool) {
		select {
		case qs.fed <- f:
			return true, false
		case <-kick:
			return false, true
		case <-qs.handlerCtx.Done():
			return false, false
		}
	}
	if qb == nil {
		sent, _ := send(fedDelivery{h: d}, nil)
		return sent
	}
	for {
		if qs.isStopping() {
			return qs.handOver(d)
		}
		a := qb.admit()
		switch a.Verdict {
		case triage.AdmitDeliver, triage.AdmitProbe:
			if a.Verdict == triage.AdmitDeliver {
				*pausedAt = time.Time{} // closed: what is held goes out now
			}
			sent, kicked := send(fedDelivery{h: d, ticket: a.Ticket, admitted: true}, qb.kick)
			if sent {
				return true
			}
			// The state changed while every worker was busy: admit d
			// again under the new state.
			qb.record(a.Ticket, triage.Outcome{Abandoned: true})
			if !kicked {
				return false
			}
		default: // pause until a.Until, or hold until a probe reports
			if pausedAt.IsZero() {
				*pausedAt = time.Now()
			}
			wait := qs.maxHold() - time.Since(*pausedAt)
			if wait <= 0 {
				// Held too long: stop the deliveries (the rest of the
				// prefetch follows d to the handlers) and consume again
				// once the breaker allows.
				qs.sub.pause()
				sent, _ := send(fedDelivery{h: d}, nil)
				return sent
			}
			if a.Verdict == triage.AdmitPause {
				wait = min(a.Until.Sub(qs.deps.cfg.Now()), wait)
			}
			if !qs.sleep(wait, qb.kick) {
				return qs.handOver(d)
			}
		}
	}
}

// leave reports h, taken up but never handled, as abandoned: the session
// ended first (the drain deadline passed, or its channel or connection is
// gone), and the broker requeues it when the channel closes. Nothing else
// reports it, and the stop's count of what it left includes it.
func (qs *queueSession) leave(h *held) {
	qs.unsettled.Add(1)
	qs.q.recordSettled(Settled{Queue: qs.q.cfg.Name, MessageID: h.d.MessageId}, OutcomeAbandoned)
}

// maxHold is the constant maxHold, or the tests' replacement.
func (qs *queueSession) maxHold() time.Duration {
	if h := qs.deps.cfg.hooks; h != nil && h.maxHold > 0 {
		return h.maxHold
	}
	return maxHold
}

// handOver hands d to a worker without admission (at a stop), unless its
// channel is gone: then nothing can settle d, the broker requeues it, and
// a handler called now would handle it twice. A lost publishing connection
// counts as gone too: the two die together when the node does, whichever
// the client notices first, and a held delivery's handler would most
// likely fail again with no way to publish its retry.
func (qs *queueSession) handOver(d *held) bool {
	if qs.handlerCtx.Err() != nil || qs.ch.IsClosed() || qs.pubConn.IsClosed() {
		return false
	}
	select {
	case qs.fed <- fedDelivery{h: d}:
		return true
	case <-qs.handlerCtx.Done():
		return false
	}
}

// sleep waits d, or until kicked; it reports false when the session stops
// first.
func (qs *queueSession) sleep(d time.Duration, kick chan struct{}) bool {
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	select {
	case <-t.C:
	case <-kick:
	case <-qs.stopping:
		return false
	case <-qs.handlerCtx.Done():
		return false
	}
	return true
}

func (qs *queueSession) isStopping() bool {
	select {
	case <-qs.stopping:
		return true
	default:
		return false
	}
}

// received notes that the feeder took d up; deliveries the client dropped
// before it are requeued (see ackWindow.received).
func (qs *queueSession) received(d *amqp.Delivery) {
	dropped, err := qs.acks.received(d)
	if len(dropped) > 0 {
		qs.deps.log.Warn("deliveries the client dropped (addressed to a cancelled consumer) were requeued", "queue", qs.q.cfg.Name, "tags", dropped, "error", err)
	}
}

// received notes that the feeder took d up. A tag skipped is a delivery the
// client dropped as addressed to a cancelled consumer: nothing else would
// settle it, and it would pin the prefix until the channel closes, so it is
// nacked with requeue. Only the feeder calls it; it returns the dropped
// tags and the first nack's error.
func (w *ackWindow) received(d *amqp.Delivery) (dropped []uint64, err error) {
	// seen is the feeder's alone: no lock on the path of every delivery
	// (a stop's flush holds the lock until the broker's cancel-ok).
	from := w.seen + 1
	w.seen = max(w.seen, d.DeliveryTag)
	for tag := from; tag < d.DeliveryTag; tag++ {
		// Marked only once written: no multiple ack covers it before.
		// A nack, not a reject: no handler saw the message, and from
		// RabbitMQ 4.3 a reject with requeue charges it a delivery.
		if rerr := w.settle(func() error { return d.Acknowledger.Nack(tag, false, true) }); rerr != nil && err == nil {
			err = rerr
		}
		dropped = append(dropped, tag)
		w.mu.Lock()
		w.mark(tag)
		w.advance()
		w.mu.Unlock()
	}
	return dropped, err
}
