package consumer

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlxbridge/dlxbridge/internal/telemetry"
	"github.com/dlxbridge/dlxbridge/triage"
)

// worker processes deliveries one at a time; it owns a confirm publisher on
// the session's publishing connection for retries and quarantine (out).
type worker struct {
	deps *deps
	q    *queueRuntime
	s    *queueSession
	out  confirmer
	// looping: the worker runs its loop (work), which a goroutine that
	// takes over from an abandoned handler call goes on with (takeOver).
	looping bool
	// pubFailures counts consecutive failed retry/quarantine publishes; it
	// drives the pause before a requeue.
	pubFailures int
	// settled is what process has learned of the delivery in hand; its
	// outcome carries it to settle, which reports it to Config.OnSettled.
	settled Settled
	// received is when process took the delivery in hand up (its clock's
	// Now): immediate retries hold it unacked from then on.
	received time.Time
	// admission is the delivery's breaker ticket (see take).
	admission admission
	// The settlements awaiting a confirm: awaiting holds a token for each
	// (at most pipelineDepth), confirmed carries each one's confirmation to
	// the worker's settler goroutine, and settling counts them until they
	// are done.
	awaiting    chan struct{}
	confirmed   chan confirmation
	settling    sync.WaitGroup
	settlerDone chan struct{} // closed when the settler has ended
	// pauseUntil (unix ns) holds the worker back after failed publishes
	// (see requeue).
	pauseUntil atomic.Int64
	// idle times the wait for a next delivery before waiting acks are
	// written.
	idle *time.Timer
	// watch ends handler calls at their deadlines and abandons those
	// that ignore them (see callCtx, runHandler).
	watch *watchdog
	// isRetry says whether a queue is one of the session's retry queues.
	isRetry func(queue string) bool
	// gate bounds the delivery in hand's schema gate (see gateCtx).
	gate gateCtx
}

func newWorker(qs *queueSession, out confirmer) *worker {
	w := &worker{deps: qs.deps, q: qs.q, s: qs, out: out,
		awaiting: make(chan struct{}, pipelineDepth), confirmed: make(chan confirmation, pipelineDepth), settlerDone: make(chan struct{})}
	w.isRetry = func(q string) bool { return qs.isRetry[q] }
	go w.settler()
	return w
}

// work runs the worker's loop until there is no delivery to take, then
// closes the worker and marks it done in qs.workers. After a stop's
// basic.cancel the client closes deliveries once it has handed over what
// came before the cancel-ok: all of it is handled, not returned to the
// queue. A goroutine whose handler call is abandoned leaves the loop
// without touching the worker: the goroutine that took over goes on with it
// (see takeOver), so one goroutine at a time is the worker.
func (w *worker) work() {
	qs := w.s
	w.looping = true
	for {
		f, ok := w.next(qs.fed)
		if !ok {
			break
		}
		w.admission.take(w.q.breaker, f)
		if qs.handlerCtx.Err() != nil {
			w.admission.release()
			qs.leave(f.h) // past the drain deadline: left for the channel close to requeue
			break
		}
		if !w.handleHeld(f.h) {
			return // abandoned in its handler
		}
		w.admission.release() // if it never reached the handler
	}
	w.close()
	qs.workers.Done()
}

// next returns the next delivery to process; false when there is none to
// take (the consumer was cancelled and its deliveries handed over, or the
// drain deadline passed). Before it waits for a delivery it writes the
// settled prefix of the acks waiting in the session's ack window (and what
// waits behind a gap once that could exhaust the prefetch: see ackWindow); after
// failed publishes it first waits out their pause, with every ack written.
func (w *worker) next(deliveries <-chan fedDelivery) (fedDelivery, bool) {
	hctx := w.s.handlerCtx
	if until := w.pauseUntil.Load(); until > 0 {
		if d := time.Until(time.Unix(0, until)); d > 0 {
			w.s.acks.flush(true)
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-hctx.Done():
			}
			t.Stop()
		}
	}
	select {
	case d, ok := <-deliveries:
		return d, ok
	default:
	}
	if w.s.acks.holds() {
		// The next delivery is usually on its way: a short wait for it
		// lets its ack join the ones waiting, rather than one write each.
		if w.idle == nil {
			w.idle = time.NewTimer(ackIdle)
		} else {
			w.idle.Reset(ackIdle)
		}
		select {
		case d, ok := <-deliveries:
			w.idle.Stop()
			return d, ok
		case <-w.idle.C:
		case <-hctx.Done():
			w.idle.Stop()
			return fedDelivery{}, false
		}
	}
	w.s.acks.beforeWait()
	select {
	case d, ok := <-deliveries:
		// Past the drain deadline a delivery is left for the channel close
		// to requeue.
		return d, ok
	case <-hctx.Done():
		return fedDelivery{}, false
	}
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

// handle processes d and settles it; false when its handler call was
// abandoned (see process).
func (w *worker) handle(d amqp.Delivery) bool {
	return w.handleHeld(w.s.hold(&d))
}

// handleHeld is handle on a delivery the feeder took up.
func (w *worker) handleHeld(h *held) bool {
	o, ok := w.process(h)
	if ok {
		w.settle(o)
	}
	return ok
}

// process takes one delivery from receipt to its outcome, in order: the
// bridge's signature and attempt count, the crash-loop guard, the schema
// gate, the handler (invoke.go); the outcome, an ack or a failure's verdict,
// is for settle to carry out. It reports false when the handler
// call was abandoned: the calling goroutine is then no longer the
// worker's (see runHandler) and must touch nothing of it.
func (w *worker) process(h *held) (outcome, bool) {
	qr := w.q
	c := w.deps
	now := c.cfg.Now()
	w.received = now
	d := &h.d
	headers := map[string]any(d.Headers)
	a := h

	ctx := telemetry.Extract(w.s.handlerCtx, d.Headers)
	// The attributes are set only on a span that records: building them
	// for the no-op tracer was a third of a message's allocations.
	ctx, span := c.tracer.Start(ctx, qr.processSpan, consumerSpan...)
	recording := span.IsRecording()
	if recording {
		span.SetAttributes(
			telemetry.AttrSystemRabbitMQ,
			telemetry.AttrOperationProcess,
			attribute.String(telemetry.AttrDestination, qr.cfg.Name),
			attribute.String(telemetry.AttrRoutingKey, d.RoutingKey),
			attribute.String(telemetry.AttrMessageID, d.MessageId),
			attribute.String(telemetry.AttrConversationID, d.CorrelationId),
			attribute.Int(telemetry.AttrBodySize, len(d.Body)),
		)
	}
	// The span goes with the outcome: settle ends it.

	// The bridge's own retry headers count only under its signature; what
	// else was forged or malformed is noted and carried to the quarantine.
	isRetry := w.isRetry
	sig, sigNotes := qr.verify(d)
	attempts := triage.CountAttempts(triage.AttemptInput{
		Headers:      headers,
		Signature:    sig,
		IsRetryQueue: isRetry,
		Now:          now,
	})
	if recording {
		span.SetAttributes(attribute.Int("dlxbridge.attempt", attempts.Failed+1))
	}
	w.settled = Settled{Queue: qr.cfg.Name, MessageID: d.MessageId, Attempt: attempts.Failed + 1}

	// 1. Crash-loop guard: a message this queue delivered too often never
	// reaches the handler again; one whose count may be another queue's is
	// re-admitted first.
	pre := triage.DeliveryInput{WorkQueue: qr.cfg.Name, Headers: headers, Redelivered: d.Redelivered,
		CarriedCounts: w.s.carriedCounts, Signed: sig.Valid, IsRetryQueue: isRetry, Failed: attempts.Failed}
	v := triage.Precheck(qr.policy, pre)
	attempts.Notes = mergeNotes(attempts.Notes, sigNotes, v.Notes)
	if v.Action != triage.ActionDeliver { // quarantine or re-admit
		if v.Action == triage.ActionQuarantine {
			if why, n := qr.publishFailures.take(d.MessageId); n > 0 {
				attempts.Notes = append(attempts.Notes, fmt.Sprintf("%d retry/quarantine publishes of this message failed before (the deliveries were requeued, not crashed); last: %s", n, why))
			}
		}
		o := outcome{kind: kindFailed, a: a, d: d, ctx: ctx, span: span, settled: w.settled,
			failed: &failedOutcome{f: failure{verdict: v, attempts: attempts}}}
		if v.Action != triage.ActionReadmit {
			return o, true
		}
		// A re-admission is built here, not in settle: one that cannot be
		// sent (one frame, max message size) is not, and the message is
		// handled here instead, with the count it arrived with (the
		// broker's delivery limit stays the backstop).
		if o = w.buildCopy(o); o.kind != kindDeadLetter {
			return o, true
		}
		attempts.Notes = append(attempts.Notes, "not re-admitted: the copy would not fit one frame or the broker's max message size; handled with the delivery count it arrived with")
	}

	// 2. Schema gate, before any handler, in the queue's mode (see admit).
	w.gate = gateCtx{Context: ctx, deadline: time.Now().Add(qr.cfg.Consumer.HandlerTimeout)}
	msg, err := qr.admit(&w.gate, d)
	w.gate = gateCtx{} // nothing of the delivery stays
	if err != nil {
		return outcome{kind: kindFailed, a: a, d: d, ctx: ctx, span: span, settled: w.settled,
			failed: &failedOutcome{f: qr.decide(err, attempts, 0, "", "")}}, true
	}
	w.settled.Type, w.settled.Version, w.settled.GateError = msg.Type, msg.Version, msg.reported
	if recording {
		span.SetAttributes(attribute.String("dlxbridge.message.type", msg.Type), attribute.String("dlxbridge.schema.version", msg.Version))
	}

	// 3. The handler (invoke.go).
	return w.invoke(ctx, span, a, d, msg, attempts, now)
}

// consumerSpan starts a process span (one slice for every message).
var consumerSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}

// close finishes what the worker started: the settlements awaiting
// confirms (the pipeline fails them at the drain deadline, see
// watchConfirms), then the acks waiting in the window; then it ends its
// settler, watchdog and publisher.
func (w *worker) close() {
	w.settling.Wait()
	close(w.confirmed)
	<-w.settlerDone
	w.s.acks.flush(true)
	if w.watch != nil {
		w.watch.stop()
	}
	if sp, ok := w.out.(*sessionPublisher); ok {
		sp.close()
	}
}
