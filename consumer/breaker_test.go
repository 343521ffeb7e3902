package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/triage"
)

// outage is a handler's dependency that fails every call for a while from
// the first call on, then recovers, and what the runtime did meanwhile.
type outage struct {
	length time.Duration
	fail   func() error // the handler's error during the outage

	mu        sync.Mutex
	start     time.Time
	failed    int            // handler calls that failed (the outage's wasted calls)
	handled   map[string]int // successful handler calls by message id
	acked     map[string]int // OutcomeAcked by message id
	maxTry    int            // the highest attempt a handler saw
	outcomes  map[Outcome]int
	done      chan struct{} // closed once every message was acked
	want      int
	doneOnce  sync.Once
	lastFail  time.Time
	firstGood time.Time
}

func newOutage(length time.Duration, want int, fail func() error) *outage {
	return &outage{length: length, fail: fail, want: want, handled: map[string]int{}, acked: map[string]int{},
		outcomes: map[Outcome]int{}, done: make(chan struct{})}
}

func (o *outage) handle(_ context.Context, m *Message) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	if o.start.IsZero() {
		o.start = now
	}
	o.maxTry = max(o.maxTry, m.Attempt)
	if now.Sub(o.start) < o.length {
		o.failed++
		o.lastFail = now
		return o.fail()
	}
	if o.firstGood.IsZero() {
		o.firstGood = now
	}
	o.handled[m.MessageID]++
	return nil
}

func (o *outage) settled(s Settled) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.outcomes[s.Outcome]++
	if s.Outcome == OutcomeAcked {
		o.acked[s.MessageID]++
	}
	// Every message ends acked or (breaker off) quarantined.
	if len(o.acked)+o.outcomes[OutcomeQuarantined] >= o.want {
		o.doneOnce.Do(func() { close(o.done) })
	}
}

// runOutage publishes n messages to a queue configured by mutate, consumes
// them with a handler behind o, and waits until every message is settled
// for good.
func runOutage(t *testing.T, n int, o *outage, mutate func(q *config.Queue)) *testBundle {
	t.Helper()
	b := setup(t, func(q *config.Queue) {
		q.Retry.MaxAttempts = 5
		q.Breaker.MinOpen = time.Second
		q.Breaker.MaxOpen = 3 * time.Second
		if mutate != nil {
			mutate(q)
		}
	})
	b.cfg.OnSettled = o.settled
	if !b.queue.Breaker.EnabledValue() { // a warning per quarantined message
		b.cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
	}
	b.cfg.hooks.breaker = func(queue string, tr triage.Transition) { t.Logf("%s: %s", queue, tr) }
	for i := range n {
		b.publishJSON(map[string]any{"id": fmt.Sprint(i)}, amqp.Publishing{MessageId: fmt.Sprintf("m-%d", i)})
	}
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(o.handle)))
	})
	select {
	case <-o.done:
	case <-time.After(o.length + 90*time.Second):
		o.mu.Lock()
		defer o.mu.Unlock()
		t.Fatalf("not every message was settled: %d of %d acked, outcomes %v", len(o.acked), n, o.outcomes)
	}
	return b
}

// The outage: a handler fails every call for 10s, then recovers,
// with hundreds of messages queued. The breaker pauses the queue: the
// handler is called a handful of times during the outage, no message
// spends more than a couple of attempts or reaches the quarantine, and
// after the recovery every message is handled exactly once.
func TestBreakerPausesQueueThroughOutage(t *testing.T) {
	t.Parallel()
	const n = 300
	cases := []struct {
		name   string
		fail   func() error
		mutate func(q *config.Queue)
	}{
		{"dependency-signal", func() error { return triage.DependencyDown(0, errors.New("payments API: 503")) }, nil},
		{"consecutive-transient", func() error { return errors.New("payments API: connection refused") },
			func(q *config.Queue) { q.Breaker.ConsecutiveFailures = 3 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := newOutage(10*time.Second, n, tc.fail)
			b := runOutage(t, n, o, tc.mutate)
			o.mu.Lock()
			defer o.mu.Unlock()
			var retries float64
			for tier := range b.queue.Retry.Tiers {
				retries += testutil.ToFloat64(b.consumer.metrics.retries.WithLabelValues(b.queue.Name, tierLabel(tier)))
			}
			opens := 0.0
			for _, st := range []triage.BreakerState{triage.BreakerClosed, triage.BreakerHalfOpen} {
				for _, cause := range []triage.BreakerCause{triage.CauseSignal, triage.CauseConsecutive, triage.CauseProbeFailed} {
					opens += testutil.ToFloat64(b.consumer.metrics.breakerTransitions.WithLabelValues(b.queue.Name, string(st), "open", string(cause)))
				}
			}
			t.Logf("outage %s: %d failed handler calls for %d messages, %v lane publishes, %v opens, highest attempt %d, outcomes %v; last failure %s after the start, first success %s",
				o.length, o.failed, n, retries, opens, o.maxTry, o.outcomes, o.lastFail.Sub(o.start).Round(time.Millisecond), o.firstGood.Sub(o.start).Round(time.Millisecond))

			// (a) Bounded: the run of failures that trips it, what was in
			// the handlers then (Concurrency), and one failed probe per
			// reopen (1s doubling to 3s: about 5 in 10s). The prefetched
			// deliveries are held, not handed to the handler. Without the
			// breaker every message fails, several times (see
			// TestBreakerOffSpendsTheOutageOnEveryMessage).
			bound := b.queue.Consumer.Concurrency + max(b.queue.Breaker.ConsecutiveFailures, 1) + int(opens)
			if o.failed > bound || o.failed > 30 {
				t.Errorf("%d handler calls failed during the outage, want at most %d (and 30; the queue holds %d)", o.failed, bound, n)
			}
			if opens < 1 {
				t.Errorf("the breaker never opened")
			}
			// (b) Nothing quarantined, few attempts spent.
			if q := o.outcomes[OutcomeQuarantined]; q != 0 {
				t.Errorf("%d messages quarantined because of the outage", q)
			}
			if d := b.queueDepth(b.wq.Quarantine); d != 0 {
				t.Errorf("quarantine holds %d messages", d)
			}
			if o.maxTry > 3 {
				t.Errorf("a message reached attempt %d", o.maxTry)
			}
			// (c) Every message handled exactly once, and acked.
			for i := range n {
				id := fmt.Sprintf("m-%d", i)
				if o.handled[id] != 1 || o.acked[id] != 1 {
					t.Errorf("%s: handled %d times, acked %d times; want 1 and 1", id, o.handled[id], o.acked[id])
				}
			}
			if d := b.queueDepth(b.queue.Name); d != 0 {
				t.Errorf("work queue holds %d messages", d)
			}
			if s := b.consumer.Breakers(); len(s) != 1 || s[0].State != triage.BreakerClosed {
				t.Errorf("breakers %+v, want one, closed", s)
			}
			if g := testutil.ToFloat64(b.consumer.metrics.breakerState.WithLabelValues(b.queue.Name)); g != 0 {
				t.Errorf("dlxbridge_breaker_state = %v, want 0 (closed)", g)
			}
		})
	}
}

// The same outage with the breaker off: every message queued spends its
// attempts on it, through the retry lanes, and the quarantine takes what
// ran out. This is what TestBreakerPausesQueueThroughOutage's bounds rule
// out, and the numbers docs/breaker.md compares.
func TestBreakerOffSpendsTheOutageOnEveryMessage(t *testing.T) {
	t.Parallel()
	const n = 300
	off := false
	o := newOutage(10*time.Second, n, func() error { return triage.DependencyDown(0, errors.New("payments API: 503")) })
	b := runOutage(t, n, o, func(q *config.Queue) { q.Breaker.Enabled = &off })
	o.mu.Lock()
	defer o.mu.Unlock()
	var retries float64
	for tier := range b.queue.Retry.Tiers {
		retries += testutil.ToFloat64(b.consumer.metrics.retries.WithLabelValues(b.queue.Name, tierLabel(tier)))
	}
	t.Logf("breaker off, outage %s: %d failed handler calls for %d messages, %v lane publishes, highest attempt %d, outcomes %v",
		o.length, o.failed, n, retries, o.maxTry, o.outcomes)
	if o.failed < n {
		t.Errorf("%d handler calls failed, want at least one per message (%d)", o.failed, n)
	}
	if len(o.acked)+o.outcomes[OutcomeQuarantined] != n {
		t.Errorf("%d acked + %d quarantined, want %d", len(o.acked), o.outcomes[OutcomeQuarantined], n)
	}
	if b.consumer.Breakers() != nil {
		t.Errorf("Breakers() = %+v with the breaker off, want none", b.consumer.Breakers())
	}
}

// The breaker's state is the queue's, not the connection's: a session that
// starts while it is open (here after a lost connection) does not consume
// until the open period is over.
func TestBreakerStaysOpenAcrossReconnect(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.env.RequireManagement() // to close a connection from the broker side
	opened := make(chan triage.Transition, 8)
	b.cfg.hooks.breaker = func(_ string, tr triage.Transition) { opened <- tr }
	reconnected := make(chan error, 4)
	b.cfg.hooks.reconnecting = func(err error) { reconnected <- err }
	var calls atomic.Int32
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			calls.Add(1)
			return triage.DependencyDown(time.Minute, errors.New("rate limited"))
		})))
	})
	b.publishJSON(map[string]any{"id": "a"}, amqp.Publishing{MessageId: "a"})
	select {
	case tr := <-opened:
		if tr.To != triage.BreakerOpen || tr.Cause != triage.CauseSignal || tr.OpenFor != time.Minute {
			t.Fatalf("transition %s, want open for 1m on the signal", tr)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the breaker did not open")
	}
	before := b.consumer.Breakers()
	if len(before) != 1 || before[0].State != triage.BreakerOpen || !before[0].Paused() {
		t.Fatalf("breakers %+v, want one, open", before)
	}
	b.waitOutcome(OutcomeRetried, 10*time.Second)

	if n := b.env.CloseConnections(b.cfg.ConnectionName); n != 1 {
		t.Fatalf("closed %d consumer connections, want 1", n)
	}
	select {
	case err := <-reconnected:
		t.Logf("runtime noticed: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("runtime did not notice the closed connection")
	}
	b.waitConsuming()
	after := b.consumer.Breakers()
	if len(after) != 1 || after[0] != before[0] {
		t.Fatalf("after the reconnect: breakers %+v, want %+v", after, before)
	}
	// The new session is connected but has no consumer on the queue: a
	// message published now waits there.
	b.publishJSON(map[string]any{"id": "b"}, amqp.Publishing{MessageId: "b"})
	q, err := b.env.Channel("inspect").QueueDeclarePassive(b.queue.Name, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	// (a's retry may be back from its lane too.)
	if q.Consumers != 0 || q.Messages < 1 {
		t.Fatalf("work queue: %d consumers, %d ready; want none and b while the breaker is open", q.Consumers, q.Messages)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler called %d times, want 1", n)
	}
	if g := testutil.ToFloat64(b.consumer.metrics.breakerState.WithLabelValues(b.queue.Name)); g != 2 {
		t.Fatalf("dlxbridge_breaker_state = %v, want 2 (open)", g)
	}
}

// A stop while the breaker is open hands the deliveries it held to their
// handlers, as a stop drains any prefetched delivery: nothing is requeued
// by the channel close (which would count toward the delivery limit) and
// nothing is lost; Run returns promptly.
func TestStopWhileBreakerOpenDrainsHeldDeliveries(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) {
		q.Consumer.Concurrency = 1
		q.Retry.MaxAttempts = 5
	})
	opened := make(chan triage.Transition, 8)
	b.cfg.hooks.breaker = func(_ string, tr triage.Transition) { opened <- tr }
	const n = 5
	for i := range n {
		b.publishJSON(map[string]any{"id": fmt.Sprint(i)}, amqp.Publishing{MessageId: fmt.Sprintf("m-%d", i)})
	}
	var calls atomic.Int32
	stop := b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			calls.Add(1)
			return triage.DependencyDown(time.Minute, errors.New("down"))
		})))
	})
	select {
	case <-opened:
	case <-time.After(15 * time.Second):
		t.Fatal("the breaker did not open")
	}
	b.waitOutcome(OutcomeRetried, 10*time.Second)
	if c := calls.Load(); c != 1 {
		t.Fatalf("handler called %d times while the breaker was open, want 1", c)
	}
	start := time.Now()
	stop()
	t.Logf("Run returned %s after the stop; handler calls %d", time.Since(start).Round(time.Millisecond), calls.Load())
	for range n - 1 {
		b.waitOutcome(OutcomeRetried, time.Second) // reported before Run returned
	}
	if d := b.queueDepth(b.queue.Name); d != 0 {
		t.Fatalf("work queue holds %d after the stop, want 0 (all parked in the retry lanes)", d)
	}
}

// A delivery is held at most maxHold (below the broker's consumer_timeout,
// which would close the channel and requeue it with a raised count): then
// it goes to its handler though the breaker is still open.
func TestBreakerHoldsPrefetchedDeliveriesAtMostMaxHold(t *testing.T) {
	t.Parallel()
	b := setup(t, func(q *config.Queue) {
		q.Consumer.Concurrency = 1
		q.Retry.MaxAttempts = 5
	})
	b.cfg.hooks.maxHold = 300 * time.Millisecond
	const n = 5
	for i := range n {
		b.publishJSON(map[string]any{"id": fmt.Sprint(i)}, amqp.Publishing{MessageId: fmt.Sprintf("m-%d", i)})
	}
	var calls atomic.Int32
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			calls.Add(1)
			return triage.DependencyDown(time.Minute, errors.New("down"))
		})))
	})
	for range n { // the breaker stays open for a minute
		b.waitOutcome(OutcomeRetried, 15*time.Second)
	}
	if s := b.consumer.Breakers(); s[0].State != triage.BreakerOpen {
		t.Fatalf("breaker %+v, want open", s[0])
	}
	if c := calls.Load(); c != n {
		t.Fatalf("handler called %d times, want %d", c, n)
	}
}
