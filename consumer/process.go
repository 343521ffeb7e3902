package consumer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/telemetry"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
)

// worker processes deliveries one at a time; it owns a confirm publisher on
// the session's publishing connection for retries and quarantine.
type worker struct {
	qs  *queueSession
	pub *amqpx.Publisher
	// pubFailures counts consecutive failed retry/quarantine publishes; it
	// drives the pause before a requeue.
	pubFailures int
	// settled is what process has learned of the delivery in hand; record
	// reports it to Config.OnSettled.
	settled Settled
}

func (w *worker) close() {
	if w.pub == nil {
		return
	}
	if blocked, _ := w.qs.blocking.Blocked(); blocked {
		// No close-ok comes before the alarm clears; the channel closes
		// with the publishing connection, which the session closes next.
		return
	}
	_ = w.pub.Close()
}

// failure is everything known about a failed delivery when it is settled.
type failure struct {
	verdict    triage.Verdict
	attempts   triage.Attempts
	err        error
	msgType    string
	version    string
	validation *schemas.ValidationError
}

// abandonGrace is how long a handler that ignores its deadline gets before
// the worker stops waiting for it.
const abandonGrace = time.Second

func (w *worker) process(d amqp.Delivery) {
	qr := w.qs.qr
	c := qr.c
	now := c.cfg.Now()
	headers := map[string]any(d.Headers)

	ctx := telemetry.Extract(w.qs.handlerCtx, d.Headers)
	ctx, span := c.tracer.Start(ctx, qr.cfg.Name+" process",
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			telemetry.AttrSystemRabbitMQ,
			telemetry.AttrOperationProcess,
			attribute.String(telemetry.AttrDestination, qr.cfg.Name),
			attribute.String(telemetry.AttrRoutingKey, d.RoutingKey),
			attribute.String(telemetry.AttrMessageID, d.MessageId),
			attribute.String(telemetry.AttrConversationID, d.CorrelationId),
			attribute.Int(telemetry.AttrBodySize, len(d.Body)),
		))
	defer span.End()

	// The bridge's own retry headers count only under its signature; what
	// else was forged or malformed is noted and carried to the quarantine.
	isRetry := func(q string) bool { return qr.isRetry[q] }
	sig, sigNotes := qr.verify(&d)
	attempts := triage.CountAttempts(triage.AttemptInput{
		Headers:      headers,
		Signature:    sig,
		IsRetryQueue: isRetry,
		Now:          now,
	})
	span.SetAttributes(attribute.Int("dlxbridge.attempt", attempts.Failed+1))
	w.settled = Settled{Queue: qr.cfg.Name, MessageID: d.MessageId, Attempt: attempts.Failed + 1}

	// 1. Crash-loop guard: a message this queue delivered too often never
	// reaches the handler again; one whose count may be another queue's is
	// re-admitted first.
	pre := triage.DeliveryInput{WorkQueue: qr.cfg.Name, Headers: headers, Redelivered: d.Redelivered,
		CarriedCounts: qr.carriedCounts, Signed: sig.Valid, IsRetryQueue: isRetry, Failed: attempts.Failed}
	v := triage.Precheck(qr.policy, pre)
	attempts.Notes = mergeNotes(attempts.Notes, sigNotes, v.Notes)
	if v.Action != triage.ActionDeliver { // quarantine or re-admit
		if v.Action == triage.ActionQuarantine {
			if why, n := qr.publishFailures.take(d.MessageId); n > 0 {
				attempts.Notes = append(attempts.Notes, fmt.Sprintf("%d retry/quarantine publishes of this message failed before (the deliveries were requeued, not crashed); last: %s", n, why))
			}
		}
		if w.settleFailure(ctx, span, &d, failure{verdict: v, attempts: attempts}) {
			return
		}
		// A re-admission that cannot fit one frame was not sent: the
		// message is handled here, with the count it arrived with (the
		// broker's delivery limit stays the backstop).
		attempts.Notes = append(attempts.Notes, "not re-admitted: the copy would not fit one frame; handled with the delivery count it arrived with")
	}

	// 2. Schema gate, before any handler, in the queue's mode (see admit).
	msg, err := qr.admit(&d)
	if err != nil {
		w.settleFailure(ctx, span, &d, qr.failed(err, attempts, "", ""))
		return
	}
	w.settled.Type, w.settled.Version, w.settled.GateError = msg.Type, msg.Version, msg.reported
	span.SetAttributes(attribute.String("dlxbridge.message.type", msg.Type), attribute.String("dlxbridge.schema.version", msg.Version))

	// 3. The handler.
	herr := w.runHandler(ctx, &d, msg, attempts, now)
	if herr != nil && w.qs.handlerCtx.Err() != nil {
		// Shutdown passed its deadline (or the connection is gone): don't
		// start a retry or quarantine publish; leave the message unsettled
		// and the broker requeues it when the channel closes. A handler that
		// succeeded is still acked below if the channel is open.
		w.settled.Err = herr
		w.record(OutcomeAbandoned)
		span.SetStatus(codes.Error, "shutdown before settle")
		return
	}
	if herr == nil {
		if w.ack(&d) {
			w.record(OutcomeAcked)
			c.metrics.attemptsSuccess.WithLabelValues(qr.cfg.Name).Observe(float64(attempts.Failed + 1))
		}
		span.SetAttributes(attribute.String("dlxbridge.outcome", OutcomeAcked))
		return
	}
	w.settleFailure(ctx, span, &d, qr.failed(herr, attempts, msg.Type, msg.Version))
}

// failed classifies a failed attempt with triage.Classify, the one path for
// every class (the gate's *schemas.ValidationError is ClassSchema), and
// decides what follows. typ and version default to the ones the gate's error
// names.
func (qr *queueRuntime) failed(err error, attempts triage.Attempts, typ, version string) failure {
	f := failure{attempts: attempts, err: err, msgType: typ, version: version}
	if errors.As(err, &f.validation) && typ == "" {
		f.msgType, f.version = f.validation.Type, f.validation.Version
	}
	class, hint := triage.Classify(err)
	f.verdict = triage.Decide(qr.policy, triage.Failure{Class: class, Hint: hint, Attempts: attempts, Now: qr.c.cfg.Now()}, randFunc(qr.c.cfg.Rand))
	return f
}

// runHandler routes, upcasts and calls the handler with a deadline. The
// upcasters and the handler run on their own goroutine under recover, so a
// panic in either is a classified failure, never a crashed process. A
// handler that ignores its deadline is abandoned after abandonGrace: the
// delivery is settled as a timeout while the goroutine keeps its slot (see
// queueRuntime.slots) until it returns, so handlers never run more than
// Concurrency at once.
func (w *worker) runHandler(ctx context.Context, d *amqp.Delivery, gm *admitted, attempts triage.Attempts, now time.Time) error {
	qr := w.qs.qr
	h, version, chain, err := qr.router.route(gm.Type, gm.Version)
	if err != nil {
		return err
	}
	m := &Message{
		Queue:           qr.cfg.Name,
		Type:            gm.Type,
		Version:         version,
		OriginalVersion: gm.Version,
		Data:            gm.Data,
		text:            gm.Raw,
		Body:            d.Body,
		// A copy: an abandoned handler must not share a map the runtime
		// reads when it republishes.
		Headers:        maps.Clone(d.Headers),
		MessageID:      d.MessageId,
		CorrelationID:  d.CorrelationId,
		IdempotencyKey: idempotencyKey(d),
		Attempt:        attempts.Failed + 1,
		ReceivedAt:     now,
		GateError:      gm.reported,
		raw:            gm.raw,
	}
	select {
	case qr.slots <- struct{}{}:
	case <-w.qs.handlerCtx.Done():
		return w.qs.handlerCtx.Err()
	}
	hctx, cancel := context.WithTimeout(ctx, qr.cfg.Consumer.HandlerTimeout)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		defer func() { <-qr.slots }()
		defer func() {
			if r := recover(); r != nil {
				done <- &triage.PanicError{Value: r, Stack: debug.Stack()}
			}
		}()
		if err := qr.upcast(m, chain); err != nil {
			done <- err
			return
		}
		done <- h.Handle(hctx, m)
	}()
	var herr error
	select {
	case herr = <-done:
	case <-hctx.Done():
		select {
		case herr = <-done:
		case <-time.After(abandonGrace):
			qr.c.metrics.abandonedHandler.WithLabelValues(qr.cfg.Name).Inc()
			qr.c.log.Error("handler ignored its deadline; abandoning it (it keeps its concurrency slot until it returns)",
				"queue", qr.cfg.Name, "type", gm.Type, "message_id", d.MessageId)
			herr = fmt.Errorf("handler did not return within %s: %w", qr.cfg.Consumer.HandlerTimeout, context.DeadlineExceeded)
		}
	}
	// A handler that returns some error after its deadline passed timed out.
	if herr != nil && hctx.Err() == context.DeadlineExceeded && !errors.Is(herr, context.DeadlineExceeded) {
		herr = fmt.Errorf("%w (after the %s deadline: %w)", herr, qr.cfg.Consumer.HandlerTimeout, context.DeadlineExceeded)
	}
	result := "ok"
	if herr != nil {
		result = "error"
	}
	qr.c.metrics.handlerDuration.WithLabelValues(qr.cfg.Name, result).Observe(time.Since(start).Seconds())
	return herr
}

// upcast runs the upcaster chain on m.Data and validates the result against
// the target version's schema. Its failures are permanent: the same input
// always upcasts the same way. A message that failed a report-mode gate is
// upcast as it is (a body that is not JSON can't be), and its result is not
// validated again: the gate reported it once.
func (qr *queueRuntime) upcast(m *Message, chain []upcaster) error {
	if len(chain) == 0 {
		return nil
	}
	if m.Data == nil && m.GateError != nil {
		return triage.Permanent(fmt.Errorf("upcast %s v%s: no data: %w", m.Type, m.OriginalVersion, m.GateError))
	}
	data := m.Data
	for _, u := range chain {
		var err error
		if data, err = u.fn(data); err != nil {
			return triage.Permanent(fmt.Errorf("upcast %s to v%s: %w", m.Type, u.to, err))
		}
	}
	// Validated as the gate validates: the violations never quote a value
	// (jsonschema's own error text does), since the error goes into the
	// quarantine envelope, its fingerprint and the log. A message the gate
	// only reported is not held to its schema here either.
	if m.GateError == nil {
		if err := qr.c.cfg.Registry.Validate(m.Type, m.Version, data); err != nil {
			return triage.Permanent(fmt.Errorf("upcast %s v%s→v%s produced invalid data: %w", m.Type, m.OriginalVersion, m.Version, err))
		}
	}
	m.Data, m.text = data, nil
	return nil
}

// settleFailure carries out a retry or quarantine verdict: publish with
// confirm + mandatory, then ack. A failed publish rejects the original with
// requeue: the broker keeps it and the crash-loop guard bounds the loop.
// It reports false, having done nothing, for a re-admission that cannot
// fit one frame: the caller delivers the message instead, since rejecting
// it would quarantine a message whose handler never ran.
func (w *worker) settleFailure(ctx context.Context, span trace.Span, d *amqp.Delivery, f failure) bool {
	qr := w.qs.qr
	c := qr.c
	v := f.verdict
	span.SetAttributes(
		attribute.String("dlxbridge.class", string(v.Class)),
		attribute.String("dlxbridge.action", string(v.Action)),
	)
	if f.err != nil {
		span.RecordError(f.err)
	}
	w.settled.failed(f)
	log := c.log.With("queue", qr.cfg.Name, "message_id", d.MessageId, "class", v.Class, "attempt", v.Attempt)
	if st := panicStack(f.err); st != "" {
		log = log.With("stack", st)
	}
	var err error
	var outcome string
	kind := "retry"
	switch v.Action {
	case triage.ActionRetry:
		err = w.publishRetry(ctx, d, f)
		outcome = OutcomeRetried
		if errors.Is(err, quarantine.ErrNoFit) {
			// A retry may not drop the producer's headers (see fitRank):
			// park it instead, where they may give way.
			f.verdict.Action = triage.ActionQuarantine
			f.verdict.Reason = fmt.Sprintf("%s; not retried: %v", v.Reason, err)
			v = f.verdict
			w.settled.failed(f)
			err = w.publishQuarantine(ctx, span, d, f)
			outcome, kind = OutcomeQuarantined, "quarantine"
		}
	case triage.ActionReadmit:
		err = w.publishReadmit(ctx, d, f)
		outcome, kind = OutcomeReadmitted, "readmit"
		if errors.Is(err, quarantine.ErrNoFit) {
			return false
		}
	default:
		err = w.publishQuarantine(ctx, span, d, f)
		outcome, kind = OutcomeQuarantined, "quarantine"
	}
	if errors.Is(err, quarantine.ErrNoFit) {
		// Not even the bare envelope fits (a frame_max far below the
		// default): nothing was sent. Reject without requeue: the broker
		// dead-letters the message as received into the quarantine, with
		// x-death as its record.
		log.Error("quarantine does not fit one frame; rejecting the original into the quarantine (broker dead-letter)", "error", err)
		if rerr := d.Reject(false); rerr != nil {
			log.Warn("reject failed (channel gone); the broker will redeliver", "error", rerr)
			return true
		}
		w.record(OutcomeQuarantined)
		c.metrics.quarantined.WithLabelValues(qr.cfg.Name, string(v.Class)).Inc()
		return true
	}
	if err != nil && w.qs.handlerCtx.Err() != nil {
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
		case <-w.qs.handlerCtx.Done():
		}
		// reject, not nack: from RabbitMQ 4.3 only reject with requeue
		// raises the delivery count the crash-loop guard relies on.
		if rerr := w.qs.settle(func() error { return d.Reject(true) }); rerr != nil {
			log.Warn("requeue failed (channel gone); the broker will redeliver", "error", rerr)
		}
		w.settled.SettleErr = err
		w.record(OutcomeRequeued)
		return true
	}
	w.pubFailures = 0
	if !w.ack(d) {
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

// publishBackoff is the pause after the n-th consecutive failed publish:
// 100ms doubling up to 10s, with full jitter on the upper half.
func (w *worker) publishBackoff() time.Duration {
	w.pubFailures++
	d := min(100*time.Millisecond<<min(w.pubFailures-1, 10), 10*time.Second)
	return d/2 + time.Duration(w.qs.qr.c.cfg.Rand()*float64(d/2))
}

// record counts a settled delivery and reports it to Config.OnSettled.
func (w *worker) record(outcome string) {
	qr := w.qs.qr
	qr.c.metrics.deliveries.WithLabelValues(qr.cfg.Name, outcome).Inc()
	w.settled.Outcome = outcome
	qr.c.notifySettled(w.settled)
}

// ack acks d and reports whether the ack was written. An ack on a dead
// channel fails: the broker will redeliver the message (a duplicate, which
// idempotency keys are for), so it is not counted as acked.
func (w *worker) ack(d *amqp.Delivery) bool {
	if err := w.qs.settle(func() error { return d.Ack(false) }); err != nil {
		qr := w.qs.qr
		w.settled.SettleErr = err
		w.record(OutcomeAckFailed)
		qr.c.log.Warn("ack failed; the broker will redeliver", "queue", qr.cfg.Name, "message_id", d.MessageId, "error", err)
		return false
	}
	return true
}

// publisher returns the worker's confirm publisher, opening one if needed.
func (w *worker) publisher() (*amqpx.Publisher, error) {
	if w.pub != nil {
		return w.pub, nil
	}
	p, err := amqpx.NewPublisherContext(w.qs.handlerCtx, w.qs.pubConn)
	if err != nil {
		return nil, err
	}
	w.pub = p
	return p, nil
}

// publish sends with confirm + mandatory; a publisher whose channel died is
// dropped so the next publish opens a fresh one.
//
// While the broker blocks the publishing connection (a resource alarm) it
// reads nothing from it: a publish, or opening a channel for one, would only
// wait, and a timeout would requeue the message and run its handler again
// for nothing. So publish first waits for the unblock, holding the delivery,
// until the drain deadline.
func (w *worker) publish(ctx context.Context, exchange, key string, p amqp.Publishing) error {
	if err := w.qs.blocking.Wait(w.qs.handlerCtx); err != nil {
		_, reason := w.qs.blocking.Blocked()
		return fmt.Errorf("the broker blocks publishing (%s) and the runtime is stopping: %w", reason, err)
	}
	pub, err := w.publisher()
	if err != nil {
		return err
	}
	pctx, cancel := w.confirmContext(ctx)
	defer cancel()
	err = pub.Publish(pctx, exchange, key, p)
	if err != nil && !errors.Is(err, amqpx.ErrUnroutable) && !errors.Is(err, amqpx.ErrNacked) {
		_ = pub.Close()
		w.pub = nil
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
func (w *worker) confirmContext(ctx context.Context) (context.Context, context.CancelFunc) {
	pctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(w.qs.handlerCtx, func() { cancel(w.qs.handlerCtx.Err()) })
	go func() {
		timer := time.NewTimer(publishTimeout)
		defer timer.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-timer.C:
				if blocked, _ := w.qs.blocking.Blocked(); !blocked {
					cancel(errConfirmTimeout)
					return
				}
				if w.qs.blocking.Wait(pctx) != nil {
					return
				}
				timer.Reset(publishTimeout)
			}
		}
	}()
	return pctx, func() { stop(); cancel(nil) }
}

type randFunc func() float64

func (f randFunc) Float64() float64 { return f() }

// panicStack is the truncated stack of a handler or upcaster panic, or "".
func panicStack(err error) string {
	var pe *triage.PanicError
	if !errors.As(err, &pe) {
		return ""
	}
	return quarantine.PanicStack(pe.Stack)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (qr *queueRuntime) typeLabel(t string) string {
	if _, ok := qr.accepts[t]; ok {
		return t
	}
	return "other"
}

func (qr *queueRuntime) versionLabel(t, v string) string {
	if qr.accepts[t][v] {
		return v
	}
	return "other"
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
