package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/triage"
)

// The runtime side of the circuit breaker (docs/breaker.md). triage.Breaker
// decides; this file carries its verdicts out:
//
//   - A queue session's deliveries pass through its feeder, one goroutine
//     that asks the breaker (Admit) before it hands a delivery to a worker,
//     and that owns the session's subscription (basic.consume).
//   - Open: the feeder hands nothing out. The deliveries already
//     prefetched but not started are held, unacked, in the process (see
//     maxHold): no handler call, no attempt, no lane publish, no delivery
//     count. Messages whose handlers are running are settled as today;
//     their acks give the consumer credit for as many deliveries, which are
//     held too, so at most the prefetch is held and what is left in the
//     work queue waits there untouched. The subscription is not cancelled:
//     a delivery that a quorum queue sent for credit given before a
//     basic.cancel and that reaches the channel after it is returned by the
//     broker with its delivery count raised (seen on 3.10.8 and 4.0.5, on
//     most pauses with acks in flight), which is what the pause is for
//     avoiding.
//   - Half-open: the held deliveries provide the probes; on hold nothing is
//     handed out until a probe reports.
//   - Only a hold longer than maxHold cancels the subscription (basic.cancel,
//     with settlements held until the cancel-ok, as at a stop) and hands the
//     held deliveries over; the feeder consumes again once the breaker
//     allows.
//
// The breaker lives in queueRuntime, so a reconnect keeps its state: a
// session that starts while the breaker is open does not consume until the
// open period is over.

// maxHold bounds how long a prefetched delivery is held in the process
// while its queue is paused. The broker closes a channel whose delivery has
// not been acknowledged within its consumer_timeout (30 minutes by
// default), which requeues everything unacked on it and raises their
// delivery counts; so a delivery held this long is handed to its handler as
// if the breaker were closed (its outcome doesn't move the breaker).
const maxHold = 10 * time.Minute

// queueBreaker is one queue's triage.Breaker and what makes its transitions
// visible. It outlives sessions.
type queueBreaker struct {
	b     *triage.Breaker
	deps  *deps
	queue string
	// kick wakes the queue's feeder after a transition or a probe's
	// outcome, to admit again.
	kick chan struct{}
}

func newQueueBreaker(d *deps, queue string, p triage.BreakerPolicy) (*queueBreaker, error) {
	b, err := triage.NewBreaker(p, randFunc(d.cfg.Rand))
	if err != nil {
		return nil, fmt.Errorf("queue %q: breaker: %w", queue, err)
	}
	d.metrics.breakerState.WithLabelValues(queue).Set(0)
	return &queueBreaker{b: b, deps: d, queue: queue, kick: make(chan struct{}, 1)}, nil
}

// admit asks the breaker about the next delivery.
func (qb *queueBreaker) admit() triage.Admission {
	a := qb.b.Admit(qb.deps.cfg.Now())
	qb.note(a.Transition)
	return a
}

// tick turns the breaker half-open if its open period is over.
func (qb *queueBreaker) tick() { qb.note(qb.b.Tick(qb.deps.cfg.Now())) }

// openEnds returns a channel that receives when the breaker's open period
// ends, nil when it is not open.
func (qb *queueBreaker) openEnds() <-chan time.Time {
	if qb == nil {
		return nil
	}
	state, until, _ := qb.b.Status()
	if state != triage.BreakerOpen {
		return nil
	}
	return time.After(max(until.Sub(qb.deps.cfg.Now()), 0))
}

// record reports the outcome of a delivery admitted with t.
func (qb *queueBreaker) record(t triage.Ticket, o triage.Outcome) {
	tr := qb.b.Record(qb.deps.cfg.Now(), t, o)
	qb.note(tr)
	if t.Probe() {
		qb.wake() // a probe slot is free again
	}
}

// note makes a transition visible: gauge, counter, log line, test hook; and
// wakes the feeder, whose subscription may have to change.
func (qb *queueBreaker) note(t triage.Transition) {
	if !t.Happened() {
		return
	}
	m := qb.deps.metrics
	m.breakerState.WithLabelValues(qb.queue).Set(breakerStateValue(t.To))
	m.breakerTransitions.WithLabelValues(qb.queue, string(t.From), string(t.To), string(t.Cause)).Inc()
	args := []any{"queue", qb.queue, "from", t.From, "to", t.To, "cause", t.Cause}
	if t.To == triage.BreakerOpen {
		args = append(args, "open_for", t.OpenFor.String(), "opens", t.Opens)
		qb.deps.log.Warn(t.String()+": consumption paused", args...)
	} else {
		qb.deps.log.Info(t.String(), args...)
	}
	if h := qb.deps.cfg.hooks; h != nil && h.breaker != nil {
		h.breaker(qb.queue, t)
	}
	qb.wake()
}

func (qb *queueBreaker) wake() {
	select {
	case qb.kick <- struct{}{}:
	default:
	}
}

// breakerStateValue is dlxbridge_breaker_state's value for s.
func breakerStateValue(s triage.BreakerState) float64 {
	switch s {
	case triage.BreakerHalfOpen:
		return 1
	case triage.BreakerOpen:
		return 2
	}
	return 0
}

// BreakerStatus is one queue's circuit breaker, as Consumer.Breakers
// reports it.
type BreakerStatus struct {
	// Queue is the work queue.
	Queue string
	// State is closed (consuming), open (paused: consuming nothing) or
	// half-open (consuming up to Probes probe messages).
	State triage.BreakerState
	// Until is when the open period ends (State open).
	Until time.Time
	// Opens counts the open periods since the breaker last closed.
	Opens int
}

// Paused reports whether the queue is not consuming normally (open or
// half-open).
func (s BreakerStatus) Paused() bool { return s.State != triage.BreakerClosed }

// Breakers reports the circuit breaker of every queue that has one
// (queues[].breaker.enabled), by queue name. An open breaker turns
// half-open when its period ends, while the queue is consuming (its
// feeder's tick), even with no delivery to admit. Safe for concurrent use.
func (c *Consumer) Breakers() []BreakerStatus {
	var out []BreakerStatus
	for name, qr := range c.queues {
		if qr.breaker == nil {
			continue
		}
		st := BreakerStatus{Queue: name}
		st.State, st.Until, st.Opens = qr.breaker.b.Status()
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b BreakerStatus) int {
		switch {
		case a.Queue < b.Queue:
			return -1
		case a.Queue > b.Queue:
			return 1
		}
		return 0
	})
	return out
}

// fedDelivery is a delivery the feeder hands to a worker, with the breaker's
// ticket when the breaker admitted it.
type fedDelivery struct {
	d        amqp.Delivery
	ticket   triage.Ticket
	admitted bool
}

// admission is the breaker ticket of the delivery a worker has in hand.
type admission struct {
	qb     *queueBreaker
	ticket triage.Ticket
	open   bool // not recorded yet
	// again: recorded, and the delivery may be retried in process; that
	// attempt's outcome is recorded with the same ticket.
	again bool
}

// take starts the admission of f.
func (a *admission) take(qb *queueBreaker, f fedDelivery) {
	*a = admission{qb: qb, ticket: f.ticket, open: qb != nil && f.admitted}
}

// breakerOutcome records the handler's result: herr's outcome, or
// abandoned when the session is ending (a handler cancelled by shutdown
// looks transient). Each handler call of a delivery is recorded, immediate
// retries included: each one is a call to the dependency. It reports
// whether the breaker lets a failed delivery be retried in process: with no
// breaker, yes; else only a delivery it admitted as closed (not a probe:
// its one outcome is the probe's answer) while it is still closed after
// this outcome. An open breaker asks for the queue to wait; retrying in
// process would call the dependency it paused for.
func (w *worker) breakerOutcome(herr error) (again bool) {
	a := &w.admission
	if !a.open && !a.again {
		return a.qb == nil
	}
	a.open, a.again = false, false
	o := triage.OutcomeOf(herr)
	if herr != nil && w.s.handlerCtx.Err() != nil {
		o = triage.Outcome{Abandoned: true}
	}
	a.qb.record(a.ticket, o)
	a.again = herr != nil && !a.ticket.Probe() && a.qb.b.State() == triage.BreakerClosed
	return a.again
}

// release records an admitted delivery that never reached its handler (the
// crash-loop guard or the schema gate settled it, or the session ended) as
// abandoned: it counts for nothing and frees a probe slot.
func (a *admission) release() {
	if !a.open {
		return
	}
	a.open = false
	a.qb.record(a.ticket, triage.Outcome{Abandoned: true})
}

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

// feed runs the session's feeder (see the top of this file) until the
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
			qs.received(&d)
			if !qs.hand(d, &pausedAt) {
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
func (qs *queueSession) hand(d amqp.Delivery, pausedAt *time.Time) bool {
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
		sent, _ := send(fedDelivery{d: d}, nil)
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
			sent, kicked := send(fedDelivery{d: d, ticket: a.Ticket, admitted: true}, qb.kick)
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
				sent, _ := send(fedDelivery{d: d}, nil)
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
func (qs *queueSession) handOver(d amqp.Delivery) bool {
	if qs.handlerCtx.Err() != nil || qs.ch.IsClosed() || qs.pubConn.IsClosed() {
		return false
	}
	select {
	case qs.fed <- fedDelivery{d: d}:
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
