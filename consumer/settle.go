package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/telemetry"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
)

// The settlement seam: what settling needs of the broker. A worker's
// acker is the delivery in hand behind its session's settle gate, and its
// confirmer the confirm publisher on the session's publishing connection;
// tests give fakes, so the decisions below are tested without a broker.
type acker interface {
	// Ack settles the delivery as done.
	Ack() error
	// Requeue rejects it with requeue: the broker delivers it again (and
	// counts the delivery toward the queue's delivery limit).
	Requeue() error
	// Reject rejects it without requeue: the broker dead-letters it.
	Reject() error
}

type confirmer interface {
	// Publish sends p with mandatory set and returns nil only once the
	// broker confirmed it: a return, a nack, a lost channel or ctx's end
	// are errors.
	Publish(ctx context.Context, exchange, key string, p amqp.Publishing) error
}

// sessionDelivery is a delivery settled through its session: acks and
// rejects wait out the start of a stop (see queueSession.settle).
type sessionDelivery struct {
	s *queueSession
	d *amqp.Delivery
}

func (sd sessionDelivery) Ack() error { return sd.s.settle(func() error { return sd.d.Ack(false) }) }
func (sd sessionDelivery) Requeue() error {
	return sd.s.settle(func() error { return sd.d.Reject(true) })
}
func (sd sessionDelivery) Reject() error {
	return sd.s.settle(func() error { return sd.d.Reject(false) })
}

// settleFailure carries out a retry, re-admission or quarantine verdict:
// build the publishing, publish it with confirm + mandatory, and only then
// ack the original. A failed publish rejects the original with requeue: the
// broker keeps it and the crash-loop guard bounds the loop. What cannot be
// parked is never acked. It reports false, having done nothing, for a
// re-admission that cannot fit one frame: the caller delivers the message
// instead, since rejecting it would quarantine a message whose handler
// never ran.
func (w *worker) settleFailure(ctx context.Context, span trace.Span, a acker, d *amqp.Delivery, f failure) bool {
	qr := w.q
	c := w.deps
	v := f.verdict
	span.SetAttributes(
		attribute.String("dlxbridge.class", string(v.Class)),
		attribute.String("dlxbridge.action", string(v.Action)),
	)
	if f.err != nil {
		span.RecordError(f.err)
	}
	log := c.log.With("queue", qr.cfg.Name, "message_id", d.MessageId, "class", v.Class, "attempt", v.Attempt)
	if st := panicStack(f.err); st != "" {
		log = log.With("stack", st)
	}
	err := w.send(ctx, span, d, f)
	if v.Action == triage.ActionReadmit && errors.Is(err, quarantine.ErrNoFit) {
		return false // w.settled untouched: the handler decides the outcome
	}
	w.settled.failed(f)
	if v.Action == triage.ActionRetry && errors.Is(err, quarantine.ErrNoFit) {
		// A retry may not drop the producer's headers (see fitRank):
		// park it instead, where they may give way.
		f.verdict.Action = triage.ActionQuarantine
		f.verdict.Reason = fmt.Sprintf("%s; not retried: %v", v.Reason, err)
		v = f.verdict
		w.settled.failed(f)
		err = w.send(ctx, span, d, f)
	}
	var outcome, kind string
	switch v.Action {
	case triage.ActionRetry:
		outcome, kind = OutcomeRetried, "retry"
	case triage.ActionReadmit:
		outcome, kind = OutcomeReadmitted, "readmit"
	default:
		outcome, kind = OutcomeQuarantined, "quarantine"
	}
	if errors.Is(err, quarantine.ErrNoFit) {
		// Not even the bare envelope fits (a frame_max far below the
		// default): nothing was sent. Reject without requeue: the broker
		// dead-letters the message as received into the quarantine, with
		// x-death as its record.
		log.Error("quarantine does not fit one frame; rejecting the original into the quarantine (broker dead-letter)", "error", err)
		if rerr := a.Reject(); rerr != nil {
			log.Warn("reject failed (channel gone); the broker will redeliver", "error", rerr)
			w.settled.SettleErr = rerr
			w.record(OutcomeAckFailed)
			return true
		}
		w.record(OutcomeQuarantined)
		c.metrics.quarantined.WithLabelValues(qr.cfg.Name, string(v.Class)).Inc()
		return true
	}
	if err != nil && w.s.handlerCtx.Err() != nil {
		// The drain deadline passed while the publish waited (typically on
		// a connection blocked by a resource alarm). Whether the broker has
		// the copy is unknown: the original is left unsettled, and the
		// channel close requeues it. Not a failure of the message's.
		w.record(OutcomeAbandoned)
		span.SetStatus(codes.Error, "shutdown before settle")
		log.Warn("shutdown before the retry/quarantine publish was confirmed; the original is left to be requeued", "action", v.Action, "error", err)
		return true
	}
	if err != nil {
		c.metrics.publishFailures.WithLabelValues(qr.cfg.Name, kind).Inc()
		qr.publishFailures.add(d.MessageId, err.Error())
		pause := w.publishBackoff()
		log.Error("publish failed; requeueing the original (not acked)", "action", v.Action, "error", err, "after", pause.String())
		span.SetStatus(codes.Error, kind+" publish failed")
		// Requeued messages keep their place and come straight back: pause
		// (this worker only) so a broker that can't take publishes right
		// now doesn't burn the message's deliveries in a hot loop.
		select {
		case <-time.After(pause):
		case <-w.s.handlerCtx.Done():
		}
		// reject, not nack: from RabbitMQ 4.3 only reject with requeue
		// raises the delivery count the crash-loop guard relies on.
		if rerr := a.Requeue(); rerr != nil {
			log.Warn("requeue failed (channel gone); the broker will redeliver", "error", rerr)
		}
		w.settled.SettleErr = err
		w.record(OutcomeRequeued)
		return true
	}
	w.pubFailures = 0
	if !w.ack(a, d.MessageId) {
		return true
	}
	w.record(outcome)
	span.SetAttributes(attribute.String("dlxbridge.outcome", outcome))
	switch outcome {
	case OutcomeRetried:
		c.metrics.retries.WithLabelValues(qr.cfg.Name, tierLabel(v.Tier)).Inc()
		log.Info("retry scheduled", "delay", v.Delay.String(), "tier", v.Tier, "reason", v.Reason, "error", errString(f.err))
	case OutcomeReadmitted:
		log.Debug("re-admitted", "reason", v.Reason)
	default:
		c.metrics.quarantined.WithLabelValues(qr.cfg.Name, string(v.Class)).Inc()
		span.SetStatus(codes.Error, "quarantined: "+v.Reason)
		log.Warn("quarantined", "reason", v.Reason, "error", errString(f.err))
	}
	return true
}

// send builds the verdict's publishing (see build) and publishes it with
// confirm inside a producer span, whose context the publishing carries so
// that the next consumer span continues the trace. A publishing that cannot
// fit one frame is not sent: the error wraps quarantine.ErrNoFit.
func (w *worker) send(ctx context.Context, consumeSpan trace.Span, d *amqp.Delivery, f failure) error {
	in := w.buildInput(d, f, consumeSpan)
	exchange, key, attrs := destination(in)
	pctx, span := w.deps.tracer.Start(ctx, exchange+" publish",
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			telemetry.AttrSystemRabbitMQ,
			telemetry.AttrOperationPublish,
			attribute.String(telemetry.AttrDestination, exchange),
			attribute.String(telemetry.AttrRoutingKey, key),
			attribute.String(telemetry.AttrMessageID, d.MessageId),
		),
		trace.WithAttributes(attrs...))
	defer span.End()
	in.trace = amqp.Table{}
	telemetry.Inject(pctx, in.trace)
	b, err := build(in)
	switch {
	case err != nil:
		w.deps.log.Warn("not sent: the message does not fit one frame", "queue", in.queue, "message_id", d.MessageId, "error", err)
	case len(b.changed) > 0:
		w.deps.log.Warn("dropped or cut headers so the message fits one frame", "queue", in.queue, "message_id", d.MessageId, "changed", b.changed)
	}
	if err == nil {
		err = w.out.Publish(pctx, b.exchange, b.key, b.p)
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}

// buildInput gathers what the builders read for d's failure f.
func (w *worker) buildInput(d *amqp.Delivery, f failure, consumeSpan trace.Span) *buildInput {
	in := &buildInput{
		d:             d,
		f:             f,
		queue:         w.q.cfg.Name,
		wq:            w.s.wq,
		now:           w.deps.cfg.Now(),
		signer:        w.deps.signer,
		redact:        w.q.redact,
		versionHeader: w.q.cfg.Message.VersionHeader,
		host:          w.deps.host,
		workerVersion: w.deps.cfg.WorkerVersion,
		frameMax:      w.s.frameMax,
	}
	if sc := consumeSpan.SpanContext(); sc.HasTraceID() {
		in.traceID = sc.TraceID().String()
	}
	return in
}

// publishBackoff is the pause after the n-th consecutive failed publish:
// 100ms doubling up to 10s, with full jitter on the upper half.
func (w *worker) publishBackoff() time.Duration {
	w.pubFailures++
	d := min(100*time.Millisecond<<min(w.pubFailures-1, 10), 10*time.Second)
	return d/2 + time.Duration(w.deps.cfg.Rand()*float64(d/2))
}

// record counts a settled delivery and reports it to Config.OnSettled.
func (w *worker) record(outcome string) {
	w.q.metrics.settled(outcome)
	w.settled.Outcome = outcome
	w.deps.notifySettled(w.settled)
}

// ack acks the delivery and reports whether the ack was written. An ack on
// a dead channel fails: the broker will redeliver the message (a duplicate,
// which idempotency keys are for), so it is not counted as acked.
func (w *worker) ack(a acker, messageID string) bool {
	if err := a.Ack(); err != nil {
		w.settled.SettleErr = err
		w.record(OutcomeAckFailed)
		w.deps.log.Warn("ack failed; the broker will redeliver", "queue", w.q.cfg.Name, "message_id", messageID, "error", err)
		return false
	}
	return true
}

// sessionPublisher is a worker's confirmer: a confirm publisher on the
// session's publishing connection, opened on first use. Not safe for
// concurrent use: each worker has its own.
type sessionPublisher struct {
	s   *queueSession
	pub *amqpx.Publisher
}

// close closes the publisher's channel, unless a resource alarm blocks the
// connection: no close-ok comes before the alarm clears, and the channel
// closes with the publishing connection, which the session closes next.
func (sp *sessionPublisher) close() {
	if sp.pub == nil {
		return
	}
	if blocked, _ := sp.s.blocking.Blocked(); blocked {
		return
	}
	_ = sp.pub.Close()
}

// publisher returns the confirm publisher, opening one if needed.
func (sp *sessionPublisher) publisher() (*amqpx.Publisher, error) {
	if sp.pub != nil {
		return sp.pub, nil
	}
	p, err := amqpx.NewPublisherContext(sp.s.handlerCtx, sp.s.pubConn)
	if err != nil {
		return nil, err
	}
	sp.pub = p
	return p, nil
}

// Publish sends with confirm + mandatory; a publisher whose channel died is
// dropped so the next publish opens a fresh one.
//
// While the broker blocks the publishing connection (a resource alarm) it
// reads nothing from it: a publish, or opening a channel for one, would only
// wait, and a timeout would requeue the message and run its handler again
// for nothing. So publish first waits for the unblock, holding the delivery,
// until the drain deadline.
func (sp *sessionPublisher) Publish(ctx context.Context, exchange, key string, p amqp.Publishing) error {
	if err := sp.s.blocking.Wait(sp.s.handlerCtx); err != nil {
		_, reason := sp.s.blocking.Blocked()
		return fmt.Errorf("the broker blocks publishing (%s) and the runtime is stopping: %w", reason, err)
	}
	pub, err := sp.publisher()
	if err != nil {
		return err
	}
	pctx, cancel := sp.s.confirmContext(ctx)
	defer cancel()
	err = pub.Publish(pctx, exchange, key, p)
	if err != nil && !errors.Is(err, amqpx.ErrUnroutable) && !errors.Is(err, amqpx.ErrNacked) {
		_ = pub.Close()
		sp.pub = nil
	}
	return err
}

// publishTimeout bounds the wait for a publisher confirm while the
// publishing connection is not blocked.
const publishTimeout = 30 * time.Second

// errConfirmTimeout ends a confirm wait that took publishTimeout.
var errConfirmTimeout = fmt.Errorf("no publisher confirm within %s", publishTimeout)

// confirmContext is ctx without its cancellation (a handler's deadline must
// not cut a publish short) that ends at the drain deadline, or after
// publishTimeout unless the broker then blocks the publishing connection:
// a confirm comes only after the unblock, so the wait goes on until it, and
// publishTimeout more.
func (qs *queueSession) confirmContext(ctx context.Context) (context.Context, context.CancelFunc) {
	pctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(qs.handlerCtx, func() { cancel(qs.handlerCtx.Err()) })
	go func() {
		timer := time.NewTimer(publishTimeout)
		defer timer.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-timer.C:
				if blocked, _ := qs.blocking.Blocked(); !blocked {
					cancel(errConfirmTimeout)
					return
				}
				if qs.blocking.Wait(pctx) != nil {
					return
				}
				timer.Reset(publishTimeout)
			}
		}
	}()
	return pctx, func() { stop(); cancel(nil) }
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// failureMemo is a small bounded map from message id to the last publish
// failure and how many there were. Safe for concurrent use.
type failureMemo struct {
	mu sync.Mutex
	m  map[string]memoEntry
}

type memoEntry struct {
	last  string
	count int
}

const failureMemoSize = 1024

func (f *failureMemo) add(id, why string) {
	if id == "" {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[string]memoEntry{}
	}
	if _, ok := f.m[id]; !ok && len(f.m) >= failureMemoSize {
		for k := range f.m { // evict an arbitrary entry: it only enriches a note
			delete(f.m, k)
			break
		}
	}
	e := f.m[id]
	f.m[id] = memoEntry{last: quarantine.Truncate(why, 256), count: e.count + 1}
}

// take returns and forgets what is known about id.
func (f *failureMemo) take(id string) (string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.m[id]
	if !ok {
		return "", 0
	}
	delete(f.m, id)
	return e.last, e.count
}
