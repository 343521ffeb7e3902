package consumer

import (
	"context"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/quarantine"
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

// outcomeKind is how a delivery is to be settled.
type outcomeKind uint8

const (
	kindAck        outcomeKind = iota // the handler succeeded: ack
	kindRetry                         // publish the delayed retry, then ack
	kindReadmit                       // publish the re-admission, then ack
	kindQuarantine                    // publish the quarantine record, then ack
	kindDeadLetter                    // no copy can be sent: reject without requeue
	kindLeave                         // the runtime is past its drain deadline: leave it for the channel close to requeue
)

// labels names a copy's kind: its outcome once acked, and its label in
// dlxbridge_publish_failures_total.
func (k outcomeKind) labels() (outcome, copyKind string) {
	switch k {
	case kindRetry:
		return OutcomeRetried, "retry"
	case kindReadmit:
		return OutcomeReadmitted, "readmit"
	}
	return OutcomeQuarantined, "quarantine"
}

// outcome is what the worker decided for one delivery, for settle to carry
// out: how to settle it, through which acker, and what OnSettled will get.
type outcome struct {
	kind outcomeKind
	a    acker
	d    *amqp.Delivery
	// span is the delivery's process span: settle ends it.
	span    trace.Span
	settled Settled
	// failed is the failure behind a copy or a dead letter; nil for an ack
	// or a delivery left unsettled at the drain deadline.
	failed *failedOutcome
}

// failedOutcome is what settling a failure needs: its verdict, the copy to
// publish, the log that names it.
type failedOutcome struct {
	f   failure
	out outgoing
	// err is why the copy was not built (settled as a failed publish) or,
	// dead-lettered, why no copy can be sent (why: unsendable's reason).
	err error
	why string
	log *slog.Logger
}

// settle carries out o, the one place a delivery is settled: an ack goes
// to the ack window; a retry, re-admission or quarantine copy is published
// with confirm + mandatory, and the original acked only once the broker
// has confirmed it (afterConfirm, on the settler), or requeued when the
// publish failed; what no copy can carry is rejected without requeue. Each
// delivery's outcome is recorded once (done), and o's span ends with it.
func (w *worker) settle(o outcome) {
	switch o.kind {
	case kindAck:
		w.ackOutcome(o, OutcomeAcked)
		if o.span.IsRecording() {
			o.span.SetAttributes(attribute.String("dlxbridge.outcome", OutcomeAcked))
		}
		o.span.End()
	case kindLeave:
		w.done(&o, OutcomeAbandoned, nil)
		o.span.SetStatus(codes.Error, "shutdown before settle")
		o.span.End()
	case kindDeadLetter:
		w.deadLetter(o)
		o.span.End()
	default:
		w.sendCopy(o)
		if o.kind == kindReadmit {
			w.settleInOrder()
		}
	}
}

// sendCopy publishes o's copy without waiting for its confirm: the worker
// goes on with its next deliveries, and the settler finishes o when the
// confirm arrives. With pipelineDepth copies awaiting confirms it first
// waits for one; past the drain deadline o is left unsettled, for the
// channel close to requeue.
func (w *worker) sendCopy(o outcome) {
	select {
	case w.awaiting <- struct{}{}:
	case <-w.s.handlerCtx.Done():
		o.failed.out.span.End()
		o.span.End()
		w.done(&o, OutcomeAbandoned, nil)
		return
	}
	w.settling.Add(1)
	fo := o.failed
	wait := w.q.metrics.confirmWait(fo.f.verdict.Action)
	sent := time.Now()
	confirmed := func(err error) {
		c := confirmation{o: o, err: err}
		if err == nil {
			wait.Observe(time.Since(sent).Seconds())
		} else {
			c.at = time.Now()
		}
		w.confirmed <- c
	}
	if fo.err != nil { // not built: settled as a failed publish
		confirmed(fo.err)
		return
	}
	w.out.Publish(fo.out.ctx, fo.out.b.exchange, fo.out.b.key, fo.out.b.p, confirmed)
}

// confirmation is a copy's confirm (err nil) or failure (at at), for the
// settler.
type confirmation struct {
	o   outcome
	err error
	at  time.Time
}

// settler finishes, one at a time and in the order their confirms came,
// the settlements whose publishes were confirmed or failed.
func (w *worker) settler() {
	defer close(w.settlerDone)
	for c := range w.confirmed {
		w.afterConfirm(c.o, c.err, c.at)
		<-w.awaiting
		w.settling.Done()
		if len(w.confirmed) == 0 {
			// About to wait: its acks must not wait for a worker that may
			// itself be waiting for a delivery.
			w.s.acks.flush(false)
		}
	}
}

// settleInOrder returns once every settlement the worker has in flight is
// finished and its ack written. A re-admission waits for it: its copy goes
// to this same queue and can be delivered before its confirm reaches the
// publishing connection, and handled while the original is unacked, a
// crash would requeue the original and re-admit it once more.
func (w *worker) settleInOrder() {
	w.settling.Wait()
	w.s.acks.flush(true)
}

// afterConfirm settles o once its copy was confirmed (err nil) or failed
// (at failedAt): the ack, or the requeue. It runs on the settler.
func (w *worker) afterConfirm(o outcome, err error, failedAt time.Time) {
	defer o.span.End()
	fo := o.failed
	if err != nil {
		fo.out.span.RecordError(err)
		fo.out.span.SetStatus(codes.Error, err.Error())
	}
	fo.out.span.End()
	result, _ := o.kind.labels()
	if err != nil && w.s.handlerCtx.Err() != nil {
		// The drain deadline passed while the publish waited (typically on
		// a connection blocked by a resource alarm). Whether the broker has
		// the copy is unknown: the original is left unsettled, and the
		// channel close requeues it. Not a failure of the message's.
		w.done(&o, OutcomeAbandoned, nil)
		o.span.SetStatus(codes.Error, "shutdown before settle")
		fo.log.Warn("shutdown before the retry/quarantine publish was confirmed; the original is left to be requeued", "action", fo.f.verdict.Action, "error", err)
		return
	}
	if err != nil {
		w.requeue(o, err, failedAt)
		return
	}
	w.pubFailures = 0
	o.span.SetAttributes(attribute.String("dlxbridge.outcome", result))
	if o.kind == kindQuarantine {
		o.span.SetStatus(codes.Error, "quarantined: "+fo.f.verdict.Reason)
	}
	w.ackOutcome(o, result)
}

// requeue settles o after its copy's publish failed with err: the
// original is rejected with requeue (the broker keeps it, and the
// crash-loop guard bounds the loop), after a pause of this worker's; a
// copy no retry could send is dead-lettered instead.
func (w *worker) requeue(o outcome, err error, failedAt time.Time) {
	fo := o.failed
	v := fo.f.verdict
	_, kind := o.kind.labels()
	w.deps.metrics.publishFailures.WithLabelValues(w.q.cfg.Name, kind).Inc()
	if max, ok := amqpx.IsTooLarge(err); ok {
		// The broker refused this copy for its body's size (before routing
		// it: no queue has it) and named its limit, which the connection's
		// later copies are checked against before they are sent.
		w.s.maxSize.learn(max)
	}
	if why, no := unsendable(err); no && o.kind != kindReadmit {
		// No copy of this body can be sent: refused by the broker, or held
		// back by the publisher (*overLimitError) once it knew the limit.
		fo.why, fo.err = why, err
		w.deadLetter(o)
		return
	}
	// A re-admission's handler never ran: requeued below, it comes back
	// and, the limit known now, is handled in place.
	w.q.publishFailures.add(o.d.MessageId, err.Error())
	// Requeued messages come straight back: the pause (this worker takes
	// no delivery until then) keeps a broker that can't take publishes
	// from burning their deliveries in a hot loop. Failures that come
	// together, as a lost channel's do, join one pause rather than add up.
	until := time.Unix(0, w.pauseUntil.Load())
	if !failedAt.Before(until) {
		until = time.Now().Add(w.publishBackoff())
		w.pauseUntil.Store(until.UnixNano())
	}
	fo.log.Error("publish failed; requeueing the original (not acked)", "action", v.Action, "error", err, "after", time.Until(until).Round(time.Millisecond).String())
	o.span.SetStatus(codes.Error, kind+" publish failed")
	t := time.NewTimer(time.Until(until))
	select {
	case <-t.C:
	case <-w.s.handlerCtx.Done():
	}
	t.Stop()
	// reject, not nack: from RabbitMQ 4.3 only reject with requeue raises
	// the delivery count the crash-loop guard relies on.
	if rerr := o.a.Requeue(); rerr != nil {
		fo.log.Warn("requeue failed (channel gone); the broker will redeliver", "error", rerr)
	}
	w.done(&o, OutcomeRequeued, err)
}

// publishBackoff is the pause after the n-th consecutive failed publish:
// 100ms doubling up to 10s, with full jitter on the upper half.
func (w *worker) publishBackoff() time.Duration {
	w.pubFailures++
	d := min(100*time.Millisecond<<min(w.pubFailures-1, 10), 10*time.Second)
	return d/2 + time.Duration(w.deps.cfg.Rand()*float64(d/2))
}

// deadLetter settles a failure that no copy can carry (o.failed.why, see
// unsendable; o.failed.err says why): it is rejected without requeue, so
// the broker dead-letters it as received, with x-death, into the
// quarantine; nothing was published and nothing is acked. A reject that
// cannot be written (the channel is gone) leaves it to the broker to
// redeliver.
func (w *worker) deadLetter(o outcome) {
	fo := o.failed
	if err := o.a.Reject(); err != nil {
		fo.log.Warn("reject failed (channel gone); the broker will redeliver", "error", err)
		w.done(&o, OutcomeAckFailed, err)
		return
	}
	o.span.SetAttributes(attribute.String("dlxbridge.outcome", OutcomeDeadLettered), attribute.String("dlxbridge.dead_letter_reason", fo.why))
	o.span.SetStatus(codes.Error, "dead-lettered ("+fo.why+"): "+fo.f.verdict.Reason)
	w.done(&o, OutcomeDeadLettered, fo.err)
}

// ackOutcome asks for o's ack and records o as result once it is written
// (acks are coalesced, see ackWindow). An ack on a dead channel fails: the
// broker will redeliver the message (a duplicate, which idempotency keys
// are for), so it is recorded as OutcomeAckFailed.
func (w *worker) ackOutcome(o outcome, result string) {
	o.a.Ack(func(err error) {
		if err != nil {
			w.done(&o, OutcomeAckFailed, err)
			w.deps.log.Warn("ack failed; the broker will redeliver", "queue", o.settled.Queue, "message_id", o.settled.MessageID, "error", err)
			return
		}
		w.done(&o, result, nil)
	})
}

// done records o as settled with result (settleErr: why it could not be
// settled as decided): the deliveries counter, Config.OnSettled, then the
// outcome's own counters and log line. It may run on another worker's
// goroutine (an ack's report): it touches nothing of w's but its queue.
func (w *worker) done(o *outcome, result string, settleErr error) {
	qr := w.q
	st := o.settled
	if settleErr != nil {
		st.SettleErr = settleErr
	}
	qr.recordSettled(st, result)
	m := w.deps.metrics
	switch result {
	case OutcomeAcked:
		qr.metrics.succeeded(st.Attempt)
		return
	case OutcomeRetried, OutcomeReadmitted, OutcomeQuarantined, OutcomeDeadLettered:
	default:
		return
	}
	fo := o.failed
	v := fo.f.verdict
	switch result {
	case OutcomeRetried:
		m.retries.WithLabelValues(qr.cfg.Name, tierLabel(v.Tier)).Inc()
		fo.log.Info("retry scheduled", "delay", v.Delay.String(), "tier", v.Tier, "reason", v.Reason, "error", errString(fo.f.err))
	case OutcomeReadmitted:
		fo.log.Debug("re-admitted", "reason", v.Reason)
	case OutcomeQuarantined:
		m.quarantined.WithLabelValues(qr.cfg.Name, string(v.Class)).Inc()
		fo.log.Warn("quarantined", "reason", v.Reason, "error", errString(fo.f.err))
	case OutcomeDeadLettered:
		m.deadLettered.WithLabelValues(qr.cfg.Name, fo.why).Inc()
		m.quarantined.WithLabelValues(qr.cfg.Name, string(v.Class)).Inc()
		fo.log.Error("no retry or quarantine copy can be published; rejected the original without requeue: the broker dead-letters it as received into the quarantine",
			"why", fo.why, "cause", fo.err, "action", v.Action, "reason", v.Reason, "error", errString(fo.f.err))
	}
}

// recordSettled counts a settled delivery and reports it to
// Config.OnSettled. Safe for concurrent use.
func (qr *queueRuntime) recordSettled(st Settled, outcome string) {
	qr.metrics.settled(outcome)
	st.Outcome = outcome
	qr.deps.notifySettled(st)
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
