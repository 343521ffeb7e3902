package consumer

import (
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
)

// Settled is one delivery's outcome, as Config.OnSettled receives it.
type Settled struct {
	// Queue is the work queue the delivery came from.
	Queue string
	// MessageID is the AMQP message id.
	MessageID string
	// Type and Version name the message's schema as far as the runtime read
	// them (the version on the wire, before any upcast): "" when the
	// crash-loop guard settled it before it was read, or when the message
	// names none.
	Type, Version string
	// Outcome is what the runtime did, one of the Outcome constants (the
	// outcome label of dlxbridge_deliveries_total).
	Outcome string
	// Class is the failure's class: triage.Classify's for the gate's and
	// the handler's errors, triage.ClassCrashLoop from the crash-loop
	// guard; "" when the handler succeeded.
	Class triage.Class
	// Reason says why a failure was retried or quarantined, as the
	// quarantine envelope does; "" when the handler succeeded.
	Reason string
	// Attempt is the attempt's number, 1 on the first delivery (for a
	// crash-loop, the attempts made).
	Attempt int
	// Tier indexes the queue's retry tiers and Delay is the retry's delay
	// (its TTL), when Outcome is OutcomeRetried.
	Tier  int
	Delay time.Duration
	// Err is the failure: the gate's *schemas.ValidationError or the
	// handler's error. nil when the handler succeeded and for a crash-loop
	// (see Reason).
	Err error
	// SettleErr is why the runtime could not settle as decided: the failed
	// retry or quarantine publish (OutcomeRequeued) or ack, the reject of
	// what could not be parked (OutcomeAckFailed), or why no copy could be
	// published (OutcomeDeadLettered: over the broker's max message size,
	// or over one frame).
	SettleErr error
	// GateError is the schema gate's objection to a message that was
	// delivered anyway because the queue's gate is in report mode; nil
	// otherwise.
	GateError *schemas.ValidationError
}

// notifySettled hands s to Config.OnSettled, if set. A panic in it is
// logged, never passed on: the delivery is settled already.
func (d *deps) notifySettled(s Settled) {
	if d.cfg.OnSettled == nil {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			d.log.Error("OnSettled panicked; the delivery was settled regardless", "queue", s.Queue, "message_id", s.MessageID, "panic", r)
		}
	}()
	d.cfg.OnSettled(s)
}

// failed notes a failure's verdict in w.settled; called again after the
// verdict changes, it replaces what it noted.
func (s *Settled) failed(f failure) {
	v := f.verdict
	s.Class, s.Reason, s.Err = v.Class, v.Reason, f.err
	s.Tier, s.Delay = 0, 0
	if v.Attempt > 0 {
		s.Attempt = v.Attempt
	}
	if s.Type == "" {
		s.Type, s.Version = f.msgType, f.version
	}
	if v.Action == triage.ActionRetry {
		s.Tier, s.Delay = v.Tier, v.Delay
	}
}

// Outcome labels of dlxbridge_deliveries_total.
const (
	OutcomeAcked       = "acked"       // the handler succeeded and the ack was sent
	OutcomeRetried     = "retried"     // a delayed retry was confirmed, then the original acked
	OutcomeQuarantined = "quarantined" // the envelope was confirmed, then the original acked
	OutcomeRequeued    = "requeued"    // a publish failed: the original was rejected with requeue
	OutcomeAckFailed   = "ack_failed"  // the ack (or reject) could not be sent (channel gone): the broker will redeliver
	OutcomeAbandoned   = "abandoned"   // shutdown passed its deadline with the message unsettled
	OutcomeReadmitted  = "readmitted"  // republished to its own work queue (its count may have been carried from upstream), then acked
	// OutcomeDeadLettered: no retry or quarantine copy could be published
	// (the body is over the broker's max message size, or not even the
	// bare envelope fits one frame): the original was rejected without
	// requeue, and the broker dead-letters it, as received, into the
	// quarantine (dlxbridge_dead_lettered_total says why).
	OutcomeDeadLettered = "dead_lettered"
)

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
