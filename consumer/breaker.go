package consumer

import (
	"fmt"
	"slices"
	"time"

	"github.com/dlxbridge/dlxbridge/triage"
)

// The runtime side of the circuit breaker (docs/breaker.md): triage.Breaker
// decides, and the session's feeder (receive.go) asks it before it hands a
// delivery to a worker. While it is open the prefetched deliveries are held
// unacked, without cancelling the subscription (a quorum queue returns what
// it sent for credit given before a basic.cancel with a raised delivery
// count), for at most maxHold. The breaker lives in queueRuntime, so its
// state outlives a reconnect.

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
	qb.deps.redrive.transition(qb.queue, t, qb.deps.cfg.Now())
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

type randFunc func() float64

func (f randFunc) Float64() float64 { return f() }
