package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/frame"
)

// What the runtime says happened to a delivery (OnSettled, the metrics)
// must be what happened at the broker: on-call people read these, not the
// wire.

// A delivery a worker takes past the drain deadline is not handled: it is
// left for the channel close to requeue, and reported once, as abandoned
// (OnSettled and dlxbridge_deliveries_total), never acked or rejected.
// Before, it was reported nowhere.
func TestADeliveryTakenPastTheDrainDeadlineIsReportedAbandoned(t *testing.T) {
	t.Parallel()
	var b *processBundle
	b = newProcessBundle(t, nil, func(ctx context.Context, m *Message) error {
		b.cancel() // the drain deadline passes while this one is handled
		return nil
	})
	qs := b.w.s
	// Both queued before the worker starts: once the first is handled, the
	// worker takes the second at once, past the deadline.
	qs.fed = make(chan fedDelivery, 2)
	first, second := b.fed(), b.fed()
	second.h.d.MessageId = "m-left"
	qs.fed <- first
	qs.fed <- second
	qs.workers.Add(1)
	go newWorker(qs, &fakeConfirmer{}).work()
	qs.workers.Wait()
	qs.acks.flush(true)
	got := map[string]Outcome{}
	for len(got) < 2 {
		st := b.waitSettled(t)
		if _, dup := got[st.MessageID]; dup {
			t.Fatalf("%s reported twice", st.MessageID)
		}
		got[st.MessageID] = st.Outcome
	}
	if got["m-left"] != OutcomeAbandoned || got["m-0000001"] != OutcomeAcked {
		t.Fatalf("outcomes %v; want m-0000001 acked, m-left abandoned", got)
	}
	m := b.w.deps.metrics
	if n := testutil.ToFloat64(m.deliveries.WithLabelValues("orders", string(OutcomeAbandoned))); n != 1 {
		t.Errorf("deliveries_total{outcome=abandoned} = %v, want 1", n)
	}
	if n := qs.unsettled.Load(); n != 1 {
		t.Errorf("the session counted %d deliveries left unsettled, want 1", n)
	}
}

// The feeder holds a delivery it cannot hand to a worker when the drain
// deadline passes: it is left for the channel close to requeue, and
// reported once, as abandoned.
func TestADeliveryTheFeederHeldAtTheDrainDeadlineIsReportedAbandoned(t *testing.T) {
	t.Parallel()
	b := newProcessBundle(t, nil, nil)
	qs := b.w.s
	qs.fed = make(chan fedDelivery) // no worker takes it
	src := make(chan amqp.Delivery)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		qs.feed(context.Background(), src, make(chan error, 1))
	}()
	d := b.delivery()
	d.MessageId = "m-held"
	src <- d // the feeder has it in hand
	b.cancel()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the feeder did not end at the drain deadline")
	}
	if st := b.waitSettled(t); st.MessageID != "m-held" || st.Outcome != OutcomeAbandoned {
		t.Fatalf("settled %s as %s, want m-held abandoned", st.MessageID, st.Outcome)
	}
	if n := qs.unsettled.Load(); n != 1 {
		t.Errorf("the session counted %d deliveries left unsettled, want 1", n)
	}
}

// A requeue after a failed publish that cannot be written (the channel is
// gone) is no "requeued": the broker requeues the message when the channel
// closes, and the report says the reject failed (ack_failed), with both
// errors. The publish failure itself is still counted.
func TestARequeueThatCannotBeWrittenIsReportedAsAFailedSettlement(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, frame.DefaultFrameSize)
	b.out.fail = func(published) error { return amqpx.ErrNacked }
	a := &fakeAcker{requeueErr: amqp.ErrClosed}
	b.settle(context.Background(), a, delivery(), quarantineFailure())
	if a.log() != "requeue" || strings.Join(b.outcomes(), ",") != string(OutcomeAckFailed) {
		t.Fatalf("calls %q, outcomes %v; want requeue, ack_failed", a.log(), b.outcomes())
	}
	if err := b.settled[0].SettleErr; !errors.Is(err, amqp.ErrClosed) || !errors.Is(err, amqpx.ErrNacked) {
		t.Errorf("settle error %v: want the requeue's and the publish's", err)
	}
	m := b.w.deps.metrics
	if n := testutil.ToFloat64(m.publishFailures.WithLabelValues(settleQueue, "quarantine")); n != 1 {
		t.Errorf("publish_failures_total{kind=quarantine} = %v, want 1 (the publish did fail)", n)
	}
	if n := testutil.ToFloat64(m.deliveries.WithLabelValues(settleQueue, string(OutcomeRequeued))); n != 0 {
		t.Errorf("deliveries_total{outcome=requeued} = %v, want 0", n)
	}
}

// A retry returned for want of its tier queue, whose quarantine copy
// cannot be built (not even the bare envelope fits one frame) or is over
// the broker's limit as learned: nothing of that copy was published, so
// it is no publish failure. The original is dead-lettered and counted so
// (dlxbridge_dead_lettered_total), as buildCopy's are; the returned retry
// is a publish failure (kind retry).
func TestAQuarantineCopyThatCannotBeBuiltIsNoPublishFailure(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		before func(w *worker)
		reason string
	}{
		{"frame", func(w *worker) { w.s.frameMax = 600 }, deadLetterFrameMax},
		{"max size", func(w *worker) { w.s.maxSize.learn(4) }, deadLetterMaxMessageSize},
	} {
		b := newSettleBundle(t, frame.DefaultFrameSize)
		out := &returnThenHold{held: make(chan func(error), 1)}
		out.before = func() { c.before(b.w) }
		b.w.out = out
		a := &fakeAcker{}
		b.settle(context.Background(), a, delivery(), retryFailure())
		if a.log() != "reject" || strings.Join(b.outcomes(), ",") != string(OutcomeDeadLettered) {
			t.Fatalf("%s: calls %q, outcomes %v; want reject, dead_lettered", c.name, a.log(), b.outcomes())
		}
		m := b.w.deps.metrics
		if n := testutil.ToFloat64(m.publishFailures.WithLabelValues(settleQueue, "quarantine")); n != 0 {
			t.Errorf("%s: publish_failures_total{kind=quarantine} = %v, want 0 (nothing was published)", c.name, n)
		}
		if n := testutil.ToFloat64(m.publishFailures.WithLabelValues(settleQueue, "retry")); n != 1 {
			t.Errorf("%s: publish_failures_total{kind=retry} = %v, want 1 (the returned retry)", c.name, n)
		}
		if n := testutil.ToFloat64(m.deadLettered.WithLabelValues(settleQueue, c.reason)); n != 1 {
			t.Errorf("%s: dead_lettered_total{reason=%s} = %v, want 1", c.name, c.reason, n)
		}
	}
}

// A copy the publisher holds back, its body over the broker's limit
// learned meanwhile on the connection (sessionPublisher.publish), was not
// published either: dead-lettered, counted so, no publish failure. A
// refusal by the broker is one (it was published): counted as both.
func TestACopyHeldBackOverTheLearnedLimitIsNoPublishFailure(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		err      error
		failures float64
	}{
		{"held back", &overLimitError{size: 12, limit: 4}, 0},
		{"refused", &amqpx.TooLargeError{Size: 12, Max: 4, Closed: amqpx.ErrPublisherClosed}, 1},
	} {
		b := newSettleBundle(t, frame.DefaultFrameSize)
		b.out.fail = func(published) error { return c.err }
		a := &fakeAcker{}
		b.settle(context.Background(), a, delivery(), quarantineFailure())
		if a.log() != "reject" || strings.Join(b.outcomes(), ",") != string(OutcomeDeadLettered) {
			t.Fatalf("%s: calls %q, outcomes %v; want reject, dead_lettered", c.name, a.log(), b.outcomes())
		}
		m := b.w.deps.metrics
		if n := testutil.ToFloat64(m.publishFailures.WithLabelValues(settleQueue, "quarantine")); n != c.failures {
			t.Errorf("%s: publish_failures_total{kind=quarantine} = %v, want %v", c.name, n, c.failures)
		}
		if n := testutil.ToFloat64(m.deadLettered.WithLabelValues(settleQueue, deadLetterMaxMessageSize)); n != 1 {
			t.Errorf("%s: dead_lettered_total{reason=max_message_size} = %v, want 1", c.name, n)
		}
	}
}

// On a real broker: a stop whose drain deadline passes with a handler
// still in flight reports that delivery abandoned, and says once, at the
// stop, how many deliveries it left for the broker to requeue. (That the
// channel close requeues it is the broker's part, tested elsewhere; its
// ready count can lag the close.)
func TestAStopPastItsDrainDeadlineCountsWhatItLeft(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	logs := &syncBuffer{}
	b.cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	b.cfg.DrainTimeout = 200 * time.Millisecond
	entered := make(chan struct{})
	stop := b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			close(entered)
			<-ctx.Done() // ends at the drain deadline
			return ctx.Err()
		})))
	})
	b.publishJSON(map[string]any{"id": "left"}, amqp.Publishing{MessageId: "left"})
	<-entered
	stop()
	b.waitOutcome(OutcomeAbandoned, 10*time.Second)
	const msg = "deliveries left unsettled at the stop; the broker requeues them when the channel closes"
	recs := logs.records(t, msg)
	if len(recs) != 1 || recs[0]["queue"] != b.queue.Name || recs[0]["count"] != float64(1) {
		t.Fatalf("stop log lines %v; want one for queue %s with count 1", recs, b.queue.Name)
	}
}

// besideThenHeldBack is a confirmer whose copy goes out and fails beside
// another publish's size refusal (the broker closed the channel under
// both); the refusal teaches the connection a limit this copy's body is
// over too, so the session publisher's re-send holds it back.
type besideThenHeldBack struct{ sp *sessionPublisher }

func (b besideThenHeldBack) Publish(ctx context.Context, exchange, key string, p amqp.Publishing, confirmed func(error)) {
	b.sp.s.maxSize.learn(4)
	b.sp.resending(ctx, exchange, key, p, confirmed, maxResends)(fmt.Errorf("%w: %w", amqpx.ErrBesideRefusal, amqpx.ErrPublisherClosed))
}

// A copy that went out and lost its channel beside another's refusal,
// then was held back on its re-send (its body over the limit that refusal
// taught), was published: it is a failed publish, as the metric's help
// says (channel lost), besides its original's dead-lettering. Counting
// only the re-send's verdict hid it.
func TestACopySentThenHeldBackOnItsResendIsAPublishFailure(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, frame.DefaultFrameSize)
	b.w.out = besideThenHeldBack{sp: &sessionPublisher{s: b.w.s}}
	a := &fakeAcker{}
	b.settle(context.Background(), a, delivery(), quarantineFailure())
	if a.log() != "reject" || strings.Join(b.outcomes(), ",") != string(OutcomeDeadLettered) {
		t.Fatalf("calls %q, outcomes %v; want reject, dead_lettered", a.log(), b.outcomes())
	}
	if err := b.settled[0].SettleErr; !errors.Is(err, amqpx.ErrBesideRefusal) {
		t.Errorf("settle error %v: want it to say the copy went out beside a refusal", err)
	}
	m := b.w.deps.metrics
	if n := testutil.ToFloat64(m.publishFailures.WithLabelValues(settleQueue, "quarantine")); n != 1 {
		t.Errorf("publish_failures_total{kind=quarantine} = %v, want 1 (it was published, and its channel closed)", n)
	}
	if n := testutil.ToFloat64(m.deadLettered.WithLabelValues(settleQueue, deadLetterMaxMessageSize)); n != 1 {
		t.Errorf("dead_lettered_total{reason=max_message_size} = %v, want 1", n)
	}
}

// A copy the broker nacked while the session still ran is a failed
// publish even when the worker's settler reaches it only past the drain
// deadline (it was pausing before an earlier requeue): the original is
// then left to the channel close (abandoned), but the broker did refuse
// the copy. Before, such failures vanished from publish_failures.
func TestAFailureTheSettlerReachesPastTheDeadlineIsStillAPublishFailure(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, frame.DefaultFrameSize)
	b.out.fail = func(published) error { return amqpx.ErrNacked }
	for range 2 {
		// Nacked at once: both failures are in before the deadline; the
		// first one's requeue waits out its pause.
		b.w.settleFailure(context.Background(), noop.Span{}, &fakeAcker{}, delivery(), quarantineFailure())
	}
	b.stop() // the drain deadline
	b.w.settling.Wait()
	m := b.w.deps.metrics
	if n := testutil.ToFloat64(m.publishFailures.WithLabelValues(settleQueue, "quarantine")); n != 2 {
		t.Errorf("publish_failures_total{kind=quarantine} = %v, want 2 (outcomes %v)", n, b.outcomes())
	}
}
