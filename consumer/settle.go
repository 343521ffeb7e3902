package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
// acker is the delivery in hand behind its session's settle gate and ack
// window, and its confirmer the confirm pipeline on the session's publishing
// connection; tests give fakes, so the decisions below are tested without a
// broker.
type acker interface {
	// Ack settles the delivery as done. Acks are coalesced (see
	// ackWindow): report is called once the ack was written (nil) or could
	// not be (the channel is gone), possibly later and on another worker's
	// goroutine.
	Ack(report func(error))
	// Requeue rejects it with requeue: the broker delivers it again (and
	// counts the delivery toward the queue's delivery limit).
	Requeue() error
	// Reject rejects it without requeue: the broker dead-letters it.
	Reject() error
}

type confirmer interface {
	// Publish sends p with mandatory set without waiting for its confirm:
	// confirmed is called exactly once, possibly before Publish returns and
	// possibly on another goroutine, with nil only once the broker
	// confirmed it; a return, a nack, a lost channel or ctx's end are
	// errors. confirmed must not block.
	Publish(ctx context.Context, exchange, key string, p amqp.Publishing, confirmed func(error))
}

// sessionDelivery is a delivery settled through its session: acks and
// rejects wait out the start of a stop (see queueSession.settle), and acks
// are coalesced in the session's ack window.
type sessionDelivery struct {
	s *queueSession
	d *amqp.Delivery
}

func (sd sessionDelivery) Ack(report func(error)) { sd.s.acks.ack(sd.d, report) }
func (sd sessionDelivery) Requeue() error {
	defer sd.s.acks.rejected(sd.d)
	return sd.s.settle(func() error { return sd.d.Reject(true) })
}
func (sd sessionDelivery) Reject() error {
	defer sd.s.acks.rejected(sd.d)
	return sd.s.settle(func() error { return sd.d.Reject(false) })
}

// pipelineDepth bounds a worker's retry and quarantine publishes awaiting
// their confirms: past it the worker waits for one before it takes the next
// delivery.
const pipelineDepth = 64

// settleFailure carries out a retry, re-admission or quarantine verdict:
// build the publishing, publish it with confirm + mandatory, and only once
// the confirm is in ack the original (finishFailure). The confirm is not
// waited for here: the worker goes on with its next deliveries and finishes
// this one when the confirm arrives (see worker.next). A failed publish
// rejects the original with requeue: the broker keeps it and the
// crash-loop guard bounds the loop. What cannot be parked is never acked.
// A copy that cannot be published at all (see unsendable: over one frame,
// or a body over the broker's max message size) is not sent; a retry is
// parked in the quarantine instead, and what even the quarantine cannot
// take is rejected without requeue (deadLetter).
// It reports false, having done nothing, for a re-admission that cannot be
// sent: the caller delivers the message instead, since rejecting it would
// quarantine a message whose handler never ran. Once it reports true the
// span is its to end.
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
	out, err := w.prepare(ctx, span, d, f)
	if _, no := unsendable(err); no && v.Action == triage.ActionReadmit {
		return false // w.settled untouched: the handler decides the outcome
	}
	w.settled.failed(f)
	if _, no := unsendable(err); no && v.Action == triage.ActionRetry {
		// A retry may not drop the producer's headers (see fitRank):
		// park it instead, where they may give way (and redaction may
		// shrink the body).
		f.verdict.Action = triage.ActionQuarantine
		f.verdict.Reason = fmt.Sprintf("%s; not retried: %v", v.Reason, err)
		v = f.verdict
		w.settled.failed(f)
		out, err = w.prepare(ctx, span, d, f)
	}
	if why, no := unsendable(err); no {
		// Not even the bare envelope fits (a frame_max far below the
		// default), or the body is over the broker's max message size:
		// nothing was sent. Reject without requeue: the broker
		// dead-letters the message as received into the quarantine, with
		// x-death as its record.
		defer span.End()
		w.deadLetter(span, a, w.settled, f, log, why, err)
		return true
	}
	wait := qr.metrics.confirmWait(v.Action)
	publish := func(confirmed func(error)) {
		if err != nil { // not built: settled as a failed publish
			confirmed(err)
			return
		}
		sent := time.Now()
		w.out.Publish(out.ctx, out.b.exchange, out.b.key, out.b.p, func(err error) {
			if err == nil {
				wait.Observe(time.Since(sent).Seconds())
			}
			confirmed(err)
		})
	}
	st := w.settled
	if !w.settleLater(publish, func(err error, at time.Time) { w.finishFailure(span, out.span, a, d, f, st, log, err, at) }) {
		// The drain deadline passed while the pipeline was full: left
		// unsettled for the channel close to requeue.
		out.span.End()
		span.End()
		w.record(OutcomeAbandoned)
	}
	return true
}

// finishFailure settles a failed delivery once its retry or quarantine
// publish is confirmed (err nil) or failed (at failedAt). It runs on the
// worker's settler goroutine.
func (w *worker) finishFailure(span, pubSpan trace.Span, a acker, d *amqp.Delivery, f failure, st Settled, log *slog.Logger, err error, failedAt time.Time) {
	defer span.End()
	if err != nil {
		pubSpan.RecordError(err)
		pubSpan.SetStatus(codes.Error, err.Error())
	}
	pubSpan.End()
	qr := w.q
	c := w.deps
	v := f.verdict
	var outcome, kind string
	switch v.Action {
	case triage.ActionRetry:
		outcome, kind = OutcomeRetried, "retry"
	case triage.ActionReadmit:
		outcome, kind = OutcomeReadmitted, "readmit"
	default:
		outcome, kind = OutcomeQuarantined, "quarantine"
	}
	if err != nil && w.s.handlerCtx.Err() != nil {
		// The drain deadline passed while the publish waited (typically on
		// a connection blocked by a resource alarm). Whether the broker has
		// the copy is unknown: the original is left unsettled, and the
		// channel close requeues it. Not a failure of the message's.
		qr.record(st, OutcomeAbandoned)
		span.SetStatus(codes.Error, "shutdown before settle")
		log.Warn("shutdown before the retry/quarantine publish was confirmed; the original is left to be requeued", "action", v.Action, "error", err)
		return
	}
	if err != nil {
		c.metrics.publishFailures.WithLabelValues(qr.cfg.Name, kind).Inc()
		if max, ok := amqpx.IsTooLarge(err); ok {
			// The broker refused this copy for its body's size (before
			// routing it: no queue has it) and named its limit, which
			// the connection's later failures are checked against
			// before they are sent (the publisher learned it already).
			w.s.maxSize.learn(max)
		}
		if why, no := unsendable(err); no && v.Action != triage.ActionReadmit {
			// No copy of this body can be sent: refused by the broker,
			// or held back by the publisher (*overLimitError) once it
			// knew the limit.
			w.deadLetter(span, a, st, f, log, why, err)
			return
		}
		// A re-admission's handler never ran: requeued below, it comes
		// back and, the limit known now, is handled in place.
		qr.publishFailures.add(d.MessageId, err.Error())
		// Requeued messages keep their place and come straight back: pause
		// (this worker only: it takes no delivery until then) so a broker
		// that can't take publishes right now doesn't burn the message's
		// deliveries in a hot loop. Failures that come together pause
		// together: one that came before the latest pause ended joins it,
		// rather than adding a longer one after it (the settler finishes
		// them one by one: a lost channel fails up to pipelineDepth at
		// once).
		until := time.Unix(0, w.pauseUntil.Load())
		if !failedAt.Before(until) {
			until = time.Now().Add(w.publishBackoff())
			w.pauseUntil.Store(until.UnixNano())
		}
		log.Error("publish failed; requeueing the original (not acked)", "action", v.Action, "error", err, "after", time.Until(until).Round(time.Millisecond).String())
		span.SetStatus(codes.Error, kind+" publish failed")
		t := time.NewTimer(time.Until(until))
		select {
		case <-t.C:
		case <-w.s.handlerCtx.Done():
		}
		t.Stop()
		// reject, not nack: from RabbitMQ 4.3 only reject with requeue
		// raises the delivery count the crash-loop guard relies on.
		if rerr := a.Requeue(); rerr != nil {
			log.Warn("requeue failed (channel gone); the broker will redeliver", "error", rerr)
		}
		st.SettleErr = err
		qr.record(st, OutcomeRequeued)
		return
	}
	w.pubFailures = 0
	span.SetAttributes(attribute.String("dlxbridge.outcome", outcome))
	switch outcome {
	case OutcomeQuarantined:
		span.SetStatus(codes.Error, "quarantined: "+v.Reason)
	}
	w.ack(a, st, outcome, func() {
		switch outcome {
		case OutcomeRetried:
			c.metrics.retries.WithLabelValues(qr.cfg.Name, tierLabel(v.Tier)).Inc()
			log.Info("retry scheduled", "delay", v.Delay.String(), "tier", v.Tier, "reason", v.Reason, "error", errString(f.err))
		case OutcomeReadmitted:
			log.Debug("re-admitted", "reason", v.Reason)
		default:
			c.metrics.quarantined.WithLabelValues(qr.cfg.Name, string(v.Class)).Inc()
			log.Warn("quarantined", "reason", v.Reason, "error", errString(f.err))
		}
	})
}

var noopSpan = trace.SpanFromContext(context.Background())

// outgoing is a built retry or quarantine publishing with its producer span.
type outgoing struct {
	b    built
	ctx  context.Context
	span trace.Span
}

// prepare builds the verdict's publishing (see build) inside a producer
// span, whose context the publishing carries so that the next consumer
// span continues the trace. A publishing that cannot fit one frame (the
// error wraps quarantine.ErrNoFit), or whose body is over the broker's max
// message size as learned on this connection (*overLimitError), is not
// sent, and the span is ended.
func (w *worker) prepare(ctx context.Context, consumeSpan trace.Span, d *amqp.Delivery, f failure) (outgoing, error) {
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
	in.trace = amqp.Table{}
	telemetry.Inject(pctx, in.trace)
	b, err := build(in)
	if limit := w.s.maxSize.get(); err == nil && overLimit(len(b.p.Body), limit) {
		// Said by settleFailure, which parks or dead-letters it.
		err = &overLimitError{size: int64(len(b.p.Body)), limit: limit}
	} else if err != nil {
		w.deps.log.Warn("not sent: the message does not fit one frame", "queue", in.queue, "message_id", d.MessageId, "error", err)
	}
	switch {
	case err != nil:
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.End()
		return outgoing{span: noopSpan}, err
	case len(b.changed) > 0:
		w.deps.log.Warn("dropped or cut headers so the message fits one frame", "queue", in.queue, "message_id", d.MessageId, "changed", b.changed)
	}
	return outgoing{b: b, ctx: pctx, span: span}, nil
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
		verifier:      w.deps.verifier,
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
func (w *worker) record(outcome string) { w.q.record(w.settled, outcome) }

// record counts a settled delivery and reports it to Config.OnSettled. Safe
// for concurrent use.
func (qr *queueRuntime) record(st Settled, outcome string) {
	qr.metrics.settled(outcome)
	st.Outcome = outcome
	qr.deps.notifySettled(st)
}

// ack acks the delivery; once the ack is written (acks are coalesced, see
// ackWindow) the outcome is recorded and then, if set, runs. An ack on a
// dead channel fails: the broker will redeliver the message (a duplicate,
// which idempotency keys are for), so it is recorded as OutcomeAckFailed.
func (w *worker) ack(a acker, st Settled, outcome string, then func()) {
	qr := w.q
	a.Ack(func(err error) {
		if err != nil {
			st.SettleErr = err
			qr.record(st, OutcomeAckFailed)
			qr.deps.log.Warn("ack failed; the broker will redeliver", "queue", qr.cfg.Name, "message_id", st.MessageID, "error", err)
			return
		}
		qr.record(st, outcome)
		if then != nil {
			then()
		}
	})
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

// settler finishes, one at a time and in the order their confirms came,
// the settlements whose publishes were confirmed or failed.
func (w *worker) settler() {
	defer close(w.settlerDone)
	for f := range w.confirmed {
		f()
		<-w.awaiting
		w.settling.Done()
		if len(w.confirmed) == 0 {
			// About to wait: its acks must not wait for a worker that may
			// itself be waiting for a delivery.
			w.s.acks.flush(false)
		}
	}
}

// settleLater starts a settlement that waits for a confirm: publish gets
// the func to call with the confirm's result, and finish then runs on the
// settler, with when the result came. With pipelineDepth settlements awaiting, it waits for one to
// finish first (until the drain deadline: false, nothing started).
func (w *worker) settleLater(publish func(confirmed func(error)), finish func(err error, at time.Time)) bool {
	select {
	case w.awaiting <- struct{}{}:
	case <-w.s.handlerCtx.Done():
		return false
	}
	w.settling.Add(1)
	publish(func(err error) {
		var at time.Time // only a failure's is read
		if err != nil {
			at = time.Now()
		}
		w.confirmed <- func() { finish(err, at) }
	})
	return true
}

// settleInOrder returns once every settlement the worker has in flight is
// finished and its ack written. A re-admission waits for it: its copy goes
// to this same queue and can be delivered before the confirm of its publish
// reaches the publishing connection; handled while the original is still
// unacked, a crash would requeue the original and re-admit it once more.
// Re-admissions are rare (upstream dead letters on RabbitMQ 3.13+), so the
// wait costs nothing that matters.
func (w *worker) settleInOrder() {
	w.settling.Wait()
	w.s.acks.flush(true)
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

// deadLetter settles a failed delivery that no copy can carry (reason, see
// unsendable; cause says why): it is rejected without requeue, so the
// broker dead-letters it as received, with x-death, into the quarantine;
// nothing was published and nothing is acked. A reject that cannot be
// written (the channel is gone) leaves it to the broker to redeliver.
func (w *worker) deadLetter(span trace.Span, a acker, st Settled, f failure, log *slog.Logger, reason string, cause error) {
	qr := w.q
	if err := a.Reject(); err != nil {
		log.Warn("reject failed (channel gone); the broker will redeliver", "error", err)
		st.SettleErr = err
		qr.record(st, OutcomeAckFailed)
		return
	}
	span.SetAttributes(attribute.String("dlxbridge.outcome", OutcomeDeadLettered), attribute.String("dlxbridge.dead_letter_reason", reason))
	span.SetStatus(codes.Error, "dead-lettered ("+reason+"): "+f.verdict.Reason)
	st.SettleErr = cause
	qr.record(st, OutcomeDeadLettered)
	w.deps.metrics.deadLettered.WithLabelValues(qr.cfg.Name, reason).Inc()
	w.deps.metrics.quarantined.WithLabelValues(qr.cfg.Name, string(f.verdict.Class)).Inc()
	log.Error("no retry or quarantine copy can be published; rejected the original without requeue: the broker dead-letters it as received into the quarantine",
		"why", reason, "cause", cause, "action", f.verdict.Action, "reason", f.verdict.Reason, "error", errString(f.err))
}
