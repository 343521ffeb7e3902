package consumer

import (
	"context"
	"log/slog"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
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
			o.span.SetAttributes(attribute.String("dlxbridge.outcome", string(OutcomeAcked)))
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
	o.span.SetAttributes(attribute.String("dlxbridge.outcome", string(OutcomeDeadLettered)), attribute.String("dlxbridge.dead_letter_reason", fo.why))
	o.span.SetStatus(codes.Error, "dead-lettered ("+fo.why+"): "+fo.f.verdict.Reason)
	w.done(&o, OutcomeDeadLettered, fo.err)
}
